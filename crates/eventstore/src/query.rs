//! Queries: filters, newest-first keyset paging, and the opaque [`Cursor`] that carries a
//! page's position.
//!
//! Pages are ordered by `(at_ms, id)` descending and a cursor is the key of the last event
//! returned, so the next page starts strictly below it: events that arrive meanwhile (newer,
//! above the first page) or that retention removes cannot shift a page, and no event is
//! returned twice or skipped.

use std::fmt;
use std::str::FromStr;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use rusqlite::types::Value;
use rusqlite::Connection;

use crate::error::StoreError;
use crate::event::{StoredEvent, EVENT_COLUMNS};

/// Most events one page may ask for.
pub const MAX_LIMIT: usize = 1000;
/// The page size of [`EventQuery::default`].
pub const DEFAULT_LIMIT: usize = 100;

/// Which events, and which page of them. All filters are exact matches and combine with AND;
/// the time range is `after_ms <= at_ms < before_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventQuery {
    pub stream: Option<String>,
    pub label: Option<String>,
    pub zone: Option<String>,
    pub kind: Option<String>,
    /// Capture time from (inclusive), unix ms.
    pub after_ms: Option<i64>,
    /// Capture time up to (exclusive), unix ms.
    pub before_ms: Option<i64>,
    /// Events per page, 1 to [`MAX_LIMIT`].
    pub limit: usize,
    /// Where the previous page ended (its `next`); `None` for the newest page.
    pub cursor: Option<Cursor>,
}

impl Default for EventQuery {
    /// Every event, newest page of [`DEFAULT_LIMIT`].
    fn default() -> Self {
        Self {
            stream: None,
            label: None,
            zone: None,
            kind: None,
            after_ms: None,
            before_ms: None,
            limit: DEFAULT_LIMIT,
            cursor: None,
        }
    }
}

/// One page of events, newest first, and the cursor of the page after it (`None` on the
/// last page).
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    pub events: Vec<StoredEvent>,
    pub next: Option<Cursor>,
}

/// The position after an event in newest-first order. Written as a URL-safe string
/// (`Display`) and read back with `FromStr`; its contents are not part of the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    at_ms: i64,
    id: String,
}

/// A cursor string this store did not issue (or one that was cut or altered).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cursor {cursor:?} is not valid ({reason}): pass the `next` cursor of a page as it was")]
pub struct CursorError {
    cursor: String,
    reason: &'static str,
}

/// Cursor strings longer than this are refused before decoding.
const MAX_CURSOR_CHARS: usize = 400;
/// Names the cursor format, so a later format can refuse old cursors clearly.
const CURSOR_VERSION: &str = "1";

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plain = format!("{CURSOR_VERSION}:{}:{}", self.at_ms, self.id);
        f.write_str(&URL_SAFE_NO_PAD.encode(plain))
    }
}

impl FromStr for Cursor {
    type Err = CursorError;

    fn from_str(text: &str) -> Result<Self, CursorError> {
        let refuse = |reason| CursorError {
            cursor: text.chars().take(MAX_CURSOR_CHARS).collect(),
            reason,
        };
        if text.len() > MAX_CURSOR_CHARS {
            return Err(refuse("too long"));
        }
        let bytes = URL_SAFE_NO_PAD
            .decode(text)
            .map_err(|_| refuse("not URL-safe base64"))?;
        let plain = String::from_utf8(bytes).map_err(|_| refuse("not text inside"))?;
        let mut parts = plain.splitn(3, ':');
        if parts.next() != Some(CURSOR_VERSION) {
            return Err(refuse("unknown cursor version"));
        }
        let at_ms = parts
            .next()
            .and_then(|at| at.parse::<i64>().ok())
            .ok_or_else(|| refuse("no time inside"))?;
        let id = parts
            .next()
            .filter(|id| !id.is_empty())
            .ok_or_else(|| refuse("no id inside"))?;
        Ok(Self {
            at_ms,
            id: id.to_owned(),
        })
    }
}

impl EventQuery {
    /// The query's own mistakes, before it reaches the database.
    pub fn validate(&self) -> Result<(), StoreError> {
        if !(1..=MAX_LIMIT).contains(&self.limit) {
            return Err(StoreError::LimitOutOfRange(self.limit));
        }
        if let (Some(after_ms), Some(before_ms)) = (self.after_ms, self.before_ms) {
            if after_ms >= before_ms {
                return Err(StoreError::EmptyTimeRange { after_ms, before_ms });
            }
        }
        Ok(())
    }

    /// The SQL and its parameters. One more row than `limit` is asked for, to learn whether
    /// a next page exists.
    fn to_sql(&self) -> (String, Vec<Value>) {
        let mut sql = format!("SELECT {EVENT_COLUMNS} FROM events WHERE 1 = 1");
        let mut params = Vec::new();
        let exact = [
            ("stream", &self.stream),
            ("label", &self.label),
            ("zone", &self.zone),
            ("kind", &self.kind),
        ];
        for (column, wanted) in exact {
            if let Some(wanted) = wanted {
                sql.push_str(&format!(" AND {column} = ?"));
                params.push(Value::Text(wanted.clone()));
            }
        }
        if let Some(after_ms) = self.after_ms {
            sql.push_str(" AND at_ms >= ?");
            params.push(Value::Integer(after_ms));
        }
        if let Some(before_ms) = self.before_ms {
            sql.push_str(" AND at_ms < ?");
            params.push(Value::Integer(before_ms));
        }
        if let Some(cursor) = &self.cursor {
            sql.push_str(" AND (at_ms, id) < (?, ?)");
            params.push(Value::Integer(cursor.at_ms));
            params.push(Value::Text(cursor.id.clone()));
        }
        sql.push_str(" ORDER BY at_ms DESC, id DESC LIMIT ?");
        params.push(Value::Integer(self.limit as i64 + 1));
        (sql, params)
    }
}

/// Runs a query the caller has validated, on a read connection.
pub(crate) fn run(conn: &Connection, query: &EventQuery) -> Result<Page, StoreError> {
    let (sql, params) = query.to_sql();
    let mut statement = conn.prepare_cached(&sql).map_err(StoreError::Read)?;
    let rows = statement
        .query_map(rusqlite::params_from_iter(params), StoredEvent::from_row)
        .map_err(StoreError::Read)?;
    let mut events = rows.collect::<Result<Vec<_>, _>>().map_err(StoreError::Read)?;
    let next = if events.len() > query.limit {
        events.truncate(query.limit);
        events.last().map(|last| Cursor {
            at_ms: last.at_ms,
            id: last.id.clone(),
        })
    } else {
        None
    };
    Ok(Page { events, next })
}

/// One event by id.
pub(crate) fn get(conn: &Connection, id: &str) -> Result<Option<StoredEvent>, StoreError> {
    let sql = format!("SELECT {EVENT_COLUMNS} FROM events WHERE id = ?");
    let mut statement = conn.prepare_cached(&sql).map_err(StoreError::Read)?;
    let mut rows = statement.query([id]).map_err(StoreError::Read)?;
    match rows.next().map_err(StoreError::Read)? {
        Some(row) => StoredEvent::from_row(row).map(Some).map_err(StoreError::Read),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_as_itself_and_is_url_safe() {
        let cursor = Cursor {
            at_ms: -12,
            id: "cam:1/é?&=+".into(),
        };
        let text = cursor.to_string();
        assert!(
            text.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
            "{text}"
        );
        assert_eq!(text.parse::<Cursor>(), Ok(cursor));
    }

    #[test]
    fn a_malformed_cursor_says_what_is_wrong() {
        let encode = |plain: &str| URL_SAFE_NO_PAD.encode(plain);
        let cases = [
            ("not*base64".to_owned(), "not URL-safe base64"),
            (URL_SAFE_NO_PAD.encode([0xff, 0xfe]), "not text inside"),
            (encode("2:5:a"), "unknown cursor version"),
            (encode("1:soon:a"), "no time inside"),
            (encode("1:5"), "no id inside"),
            (encode("1:5:"), "no id inside"),
            ("A".repeat(401), "too long"),
        ];
        for (text, reason) in cases {
            let error = text.parse::<Cursor>().unwrap_err();
            assert_eq!(error.reason, reason, "{text}");
            let message = StoreError::from(error).to_string();
            assert!(
                message.contains(reason) && message.contains("cursor"),
                "{message}"
            );
        }
    }

    #[test]
    fn limits_outside_1_to_1000_and_empty_time_ranges_are_refused() {
        for (limit, ok) in [(0, false), (1, true), (1000, true), (1001, false)] {
            let query = EventQuery {
                limit,
                ..EventQuery::default()
            };
            assert_eq!(query.validate().is_ok(), ok, "limit {limit}");
        }
        let error = EventQuery {
            limit: 0,
            ..EventQuery::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "limit 0 is out of range: ask for 1 to 1000 events per page"
        );
        assert!(error.is_bad_request());
        let range = |after_ms, before_ms| EventQuery {
            after_ms: Some(after_ms),
            before_ms: Some(before_ms),
            ..EventQuery::default()
        };
        assert!(range(5, 6).validate().is_ok());
        assert!(matches!(
            range(6, 6).validate(),
            Err(StoreError::EmptyTimeRange { .. })
        ));
        assert!(matches!(
            range(7, 6).validate(),
            Err(StoreError::EmptyTimeRange { .. })
        ));
    }

    /// SQLite's plan for a query: one line per step.
    fn plan(conn: &Connection, query: &EventQuery) -> Vec<String> {
        let (sql, params) = query.to_sql();
        let mut statement = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let rows = statement
            .query_map(rusqlite::params_from_iter(params), |row| row.get::<_, String>(3))
            .unwrap();
        rows.map(Result::unwrap).collect()
    }

    #[test]
    fn every_filter_walks_an_index_in_page_order_without_sorting() {
        let dir = tempfile::tempdir().unwrap();
        let conn = crate::schema::open_writer(&dir.path().join("events.sqlite3")).unwrap();
        let cursor = Some(Cursor {
            at_ms: 5,
            id: "x".into(),
        });
        let some = |text: &str| Some(text.to_owned());
        let queries = [
            EventQuery::default(),
            EventQuery {
                after_ms: Some(1),
                before_ms: Some(9),
                ..EventQuery::default()
            },
            EventQuery {
                cursor: cursor.clone(),
                ..EventQuery::default()
            },
            EventQuery {
                stream: some("gate"),
                cursor: cursor.clone(),
                ..EventQuery::default()
            },
            EventQuery {
                label: some("person"),
                after_ms: Some(1),
                ..EventQuery::default()
            },
            EventQuery {
                zone: some("dock"),
                ..EventQuery::default()
            },
            EventQuery {
                kind: some("line.cross"),
                before_ms: Some(9),
                ..EventQuery::default()
            },
        ];
        for query in queries {
            let plan = plan(&conn, &query);
            assert!(
                plan.iter()
                    .all(|step| step.contains("USING INDEX") && !step.contains("TEMP B-TREE")),
                "{query:?}: {plan:?}"
            );
        }
    }
}
