//! Peregrine's access control, as plain decisions: no HTTP types and no clock of its own
//! (the rate limiter reads time through governor's `Clock`, which tests replace with a
//! fake one).
//!
//! - `keys`: the keys file ([`KeyStore`]): keys stored as SHA-256 hashes with their
//!   [`Scope`]s and limits, verified in constant time; [`new_key`] makes a fresh key.
//! - `limits`: each key's request rate (governor) and requests at once ([`Permit`]).
//! - [`AccessControl`]: given the key a request presents and the scope its route needs,
//!   a [`Grant`] (holding the key's concurrency permit) or a [`Denial`] saying why.

mod keys;
mod limits;

use std::time::Duration;

use governor::clock::{Clock, DefaultClock};

pub use keys::{new_key, KeyEntry, KeyLimits, KeyStore, KeysError, NewKey, Scope};
pub use limits::Permit;

use limits::{KeyLimiter, Limited};

/// The key id of requests when access control is off.
pub const ANONYMOUS: &str = "anonymous";
/// The key id of requests whose key is missing or unknown: metric labels stay bounded by
/// the keys file, whatever clients send.
pub const UNKNOWN: &str = "unknown";

/// What a route asks of the request's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requirement {
    /// Anyone (health probes and metrics, unless protected).
    Open,
    /// Any known key, whatever its scopes (protected health and metrics).
    AnyKey,
    /// A known key with this scope.
    Scope(Scope),
}

/// A request allowed through. Keep it until the response is sent: it holds the key's
/// concurrency permit.
#[derive(Debug)]
pub struct Grant {
    /// The key's id, or [`ANONYMOUS`].
    pub key_id: String,
    _permit: Option<Permit>,
}

/// Why a request was refused. Displays name the key id, never the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denial {
    #[error("an API key is required: send it as `Authorization: Bearer <key>` or `x-api-key: <key>`")]
    MissingKey,
    #[error("the API key is not valid")]
    UnknownKey,
    #[error("API key {key_id:?} lacks the \"{scope}\" scope this request needs")]
    MissingScope { key_id: String, scope: Scope },
    #[error("API key {key_id:?} is over its rate limit; retry in {} ms", retry_after.as_millis())]
    RateLimited { key_id: String, retry_after: Duration },
    #[error("API key {key_id:?} already has {limit} requests in flight, its limit")]
    ConcurrencyLimited { key_id: String, limit: u32 },
}

impl Denial {
    /// The `outcome` label of `peregrine_auth_requests_total`.
    pub fn outcome(&self) -> &'static str {
        match self {
            Denial::MissingKey => "missing_key",
            Denial::UnknownKey => "unknown_key",
            Denial::MissingScope { .. } => "forbidden",
            Denial::RateLimited { .. } => "rate_limited",
            Denial::ConcurrencyLimited { .. } => "concurrency_limited",
        }
    }

    /// The `key_id` label: the key's id when it was known, else [`UNKNOWN`].
    pub fn key_id(&self) -> &str {
        match self {
            Denial::MissingKey | Denial::UnknownKey => UNKNOWN,
            Denial::MissingScope { key_id, .. }
            | Denial::RateLimited { key_id, .. }
            | Denial::ConcurrencyLimited { key_id, .. } => key_id,
        }
    }

    /// How long to wait before retrying, for limits (at least a second, as Retry-After
    /// counts whole seconds).
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            Denial::RateLimited { retry_after, .. } => {
                Some(retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0)).map(|s| s.max(1))
            }
            Denial::ConcurrencyLimited { .. } => Some(1),
            _ => None,
        }
    }
}

/// Who may do what: either no keys (everyone may do everything, as `anonymous`) or a
/// [`KeyStore`] with each key's limits.
pub struct AccessControl<C: Clock = DefaultClock> {
    keys: Option<(KeyStore, Vec<KeyLimiter<C>>)>,
    clock: C,
}

impl AccessControl<DefaultClock> {
    /// No keys: every request passes as [`ANONYMOUS`].
    pub fn anonymous() -> Self {
        AccessControl {
            keys: None,
            clock: DefaultClock::default(),
        }
    }

    pub fn with_keys(store: KeyStore) -> Self {
        Self::with_keys_and_clock(store, DefaultClock::default())
    }
}

impl<C: Clock + Clone> AccessControl<C> {
    pub fn with_keys_and_clock(store: KeyStore, clock: C) -> Self {
        let limiters = store
            .entries()
            .iter()
            .map(|e| KeyLimiter::new(&e.limits, &clock))
            .collect();
        AccessControl {
            keys: Some((store, limiters)),
            clock,
        }
    }

    /// Whether requests need keys at all.
    pub fn requires_keys(&self) -> bool {
        self.keys.is_some()
    }

    /// The decision for a request presenting `presented` (if any) to a route needing
    /// `required`. Open routes pass without looking at keys or limits.
    pub fn authorize(&self, presented: Option<&str>, required: Requirement) -> Result<Grant, Denial> {
        let Some((store, limiters)) = &self.keys else {
            return Ok(grant(ANONYMOUS));
        };
        if required == Requirement::Open {
            return Ok(grant(ANONYMOUS));
        }
        let index = store
            .position(presented.ok_or(Denial::MissingKey)?)
            .ok_or(Denial::UnknownKey)?;
        let entry = &store.entries()[index];
        if let Requirement::Scope(scope) = required {
            if !entry.allows(scope) {
                return Err(Denial::MissingScope {
                    key_id: entry.id.clone(),
                    scope,
                });
            }
        }
        let permit = limiters[index]
            .admit(&self.clock)
            .map_err(|limited| match limited {
                Limited::Rate(retry_after) => Denial::RateLimited {
                    key_id: entry.id.clone(),
                    retry_after,
                },
                Limited::Concurrency(limit) => Denial::ConcurrencyLimited {
                    key_id: entry.id.clone(),
                    limit,
                },
            })?;
        Ok(Grant {
            key_id: entry.id.clone(),
            _permit: permit,
        })
    }
}

fn grant(key_id: &str) -> Grant {
    Grant {
        key_id: key_id.to_string(),
        _permit: None,
    }
}

#[cfg(test)]
mod tests {
    use governor::clock::FakeRelativeClock;
    use sha2::{Digest, Sha256};

    use super::*;

    fn control(clock: &FakeRelativeClock) -> AccessControl<FakeRelativeClock> {
        let hash = |k: &str| hex::encode(Sha256::digest(k.as_bytes()));
        let text = format!(
            "[[keys]]\nid = \"reader\"\nsha256 = \"{}\"\nscopes = [\"infer\"]\nrequests_per_s = 1\nmax_concurrent = 1\n\
             [[keys]]\nid = \"ops\"\nsha256 = \"{}\"\nscopes = [\"admin\"]\n",
            hash("pk_reader"),
            hash("pk_ops")
        );
        AccessControl::with_keys_and_clock(KeyStore::parse(&text).unwrap(), clock.clone())
    }

    #[test]
    fn decisions_follow_key_scope_and_limits() {
        let clock = FakeRelativeClock::default();
        let access = control(&clock);
        let infer = Requirement::Scope(Scope::Infer);
        assert_eq!(access.authorize(None, infer).unwrap_err(), Denial::MissingKey);
        assert_eq!(
            access.authorize(Some("pk_nope"), infer).unwrap_err(),
            Denial::UnknownKey
        );
        let denied = access
            .authorize(Some("pk_reader"), Requirement::Scope(Scope::Admin))
            .unwrap_err();
        assert_eq!((denied.outcome(), denied.key_id()), ("forbidden", "reader"));
        let ops = access
            .authorize(Some("pk_ops"), Requirement::Scope(Scope::Admin))
            .unwrap();
        assert_eq!(ops.key_id, "ops");
        assert!(
            access.authorize(Some("pk_ops"), infer).is_err(),
            "admin does not include infer"
        );
        assert_eq!(
            access.authorize(None, Requirement::Open).unwrap().key_id,
            ANONYMOUS
        );
        assert!(access.authorize(Some("pk_ops"), Requirement::AnyKey).is_ok());
        assert!(access.authorize(None, Requirement::AnyKey).is_err());
    }

    #[test]
    fn limits_apply_per_key_and_say_when_to_retry() {
        let clock = FakeRelativeClock::default();
        let access = control(&clock);
        let infer = Requirement::Scope(Scope::Infer);
        let held = access.authorize(Some("pk_reader"), infer).unwrap();
        let busy = access.authorize(Some("pk_reader"), infer).unwrap_err();
        assert_eq!(
            (busy.outcome(), busy.retry_after_secs()),
            ("concurrency_limited", Some(1))
        );
        drop(held);
        let limited = access.authorize(Some("pk_reader"), infer).unwrap_err();
        assert_eq!(limited.outcome(), "rate_limited");
        assert_eq!(limited.retry_after_secs(), Some(1));
        assert!(!limited.to_string().contains("pk_reader"), "{limited}");
        for _ in 0..5 {
            assert!(access
                .authorize(Some("pk_ops"), Requirement::Scope(Scope::Admin))
                .is_ok());
        }
        clock.advance(Duration::from_secs(1));
        assert!(access.authorize(Some("pk_reader"), infer).is_ok());
    }

    #[test]
    fn without_keys_everything_passes_as_anonymous() {
        let access = AccessControl::anonymous();
        assert!(!access.requires_keys());
        let g = access.authorize(None, Requirement::Scope(Scope::Admin)).unwrap();
        assert_eq!(g.key_id, ANONYMOUS);
    }
}
