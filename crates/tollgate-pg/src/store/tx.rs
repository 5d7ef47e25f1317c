//! `Tx`: a transaction whose connection never goes back to the pool dirty.
//!
//! sqlx's `Pool::begin` is not cancellation-safe in sqlx 0.9.0: a future
//! dropped while `BEGIN` is in flight leaves the session inside a transaction
//! that nothing rolls back, and the pool hands that session to the next
//! borrower, whose autocommitted writes then vanish with the next rollback.
//! `PostgresStore` never lets its operations be dropped (`complete`), but a
//! task can still end early: a panic, or a runtime shutting down. So the
//! connection itself carries the rule: it goes back to the pool only after a
//! `COMMIT` or `ROLLBACK` that PostgreSQL answered. In every other case it is
//! closed, and PostgreSQL rolls back whatever the session had open.

use std::ops::{Deref, DerefMut};

use sqlx::pool::PoolConnection;
use sqlx::{Executor, PgConnection, PgPool, Postgres};

use super::sql::{BEGIN_SQL, COMMIT_SQL, ROLLBACK_SQL};

/// One open transaction on a pooled connection.
pub(crate) struct Tx {
    conn: PoolConnection<Postgres>,
    /// Whether the session may be inside a transaction: from before `BEGIN`
    /// is sent until `COMMIT` or `ROLLBACK` is answered.
    open: bool,
}

impl Tx {
    pub(crate) async fn begin(pool: &PgPool) -> Result<Self, sqlx::Error> {
        let conn = pool.acquire().await?;
        // Open from here on: if this future is dropped while BEGIN is in
        // flight, the connection is closed rather than reused.
        let mut tx = Self { conn, open: true };
        tx.conn.execute(BEGIN_SQL).await?;
        Ok(tx)
    }

    pub(crate) async fn commit(mut self) -> Result<(), sqlx::Error> {
        self.conn.execute(COMMIT_SQL).await?;
        self.open = false;
        Ok(())
    }

    pub(crate) async fn rollback(mut self) -> Result<(), sqlx::Error> {
        self.conn.execute(ROLLBACK_SQL).await?;
        self.open = false;
        Ok(())
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        if self.open {
            self.conn.close_on_drop();
        }
    }
}

impl Deref for Tx {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.conn
    }
}

impl DerefMut for Tx {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.conn
    }
}
