//! The read connections, lent one query at a time. The idle ones wait in a bounded channel
//! as large as the pool, so returning one never blocks and a caller who finds none idle
//! waits for the next one back. (r2d2_sqlite would do this, but it trails rusqlite's
//! releases; a channel of connections is all this needs.)

use std::path::Path;

use crossbeam_channel::{Receiver, Sender};
use rusqlite::Connection;

use crate::error::StoreError;
use crate::schema;

pub(crate) struct ReadPool {
    give_back: Sender<Connection>,
    idle: Receiver<Connection>,
}

impl ReadPool {
    pub(crate) fn open(path: &Path, connections: usize) -> Result<Self, StoreError> {
        let (give_back, idle) = crossbeam_channel::bounded(connections);
        for _ in 0..connections {
            let conn = schema::open_reader(path)?;
            give_back
                .try_send(conn)
                .expect("the pool channel holds every connection");
        }
        Ok(Self { give_back, idle })
    }

    /// Runs `read` on an idle connection, waiting for one if all are lent.
    pub(crate) fn with<T>(
        &self,
        read: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        // The pool holds both ends, so the channel never disconnects.
        let conn = self.idle.recv().expect("the pool keeps its own sender");
        let lent = Lent {
            conn: Some(conn),
            give_back: &self.give_back,
        };
        read(lent.conn.as_ref().expect("lent until dropped"))
    }
}

/// A lent connection; it goes back to the pool when dropped, also if the read panicked.
struct Lent<'pool> {
    conn: Option<Connection>,
    give_back: &'pool Sender<Connection>,
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            let _ = self.give_back.try_send(conn);
        }
    }
}
