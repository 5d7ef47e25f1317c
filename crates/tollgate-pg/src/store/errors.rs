//! How the store's failures become the core's errors, and the conversions
//! between the core's values and PostgreSQL's.

use tollgate_core::{Error, IngestError};
use tollgate_store::GuardViolation;

pub(super) fn corrupt(message: String) -> Error {
    Error::StorageCorrupt(message)
}

/// Operational failures are retryable; failures that mean the stored data or
/// schema is not what the store relies on are corruption, which needs repair.
pub(super) fn storage_error(error: sqlx::Error) -> Error {
    use sqlx::Error as E;
    if let E::Database(db) = &error {
        // The statement failed as a whole and its transaction rolls back, so
        // these say that nothing was applied and a retry can succeed.
        let waited = match db.code().as_deref() {
            Some("55P03") => Some("a row it needs stayed locked past lock_timeout"),
            Some("40P01") => Some("PostgreSQL broke a lock cycle"),
            _ => None,
        };
        if let Some(why) = waited {
            return Error::StorageUnavailable(format!("{why}; nothing was applied, retry: {error}"));
        }
    }
    let corrupt_kind = match &error {
        E::Database(db) => {
            let code = db.code().unwrap_or_default();
            // 22: data exception, 23: integrity violation, 42: the schema is
            // not the one these statements were written for.
            code.starts_with("22") || code.starts_with("23") || code.starts_with("42")
        }
        E::RowNotFound
        | E::TypeNotFound { .. }
        | E::ColumnIndexOutOfBounds { .. }
        | E::ColumnNotFound(_)
        | E::ColumnDecode { .. }
        | E::Decode(_) => true,
        _ => false,
    };
    if corrupt_kind { Error::StorageCorrupt(error.to_string()) } else { Error::StorageUnavailable(error.to_string()) }
}

pub(super) fn ingest_error(error: Error) -> IngestError {
    match error {
        Error::StorageUnavailable(message) => IngestError::Unavailable(message),
        Error::CounterOverflow { counter } => IngestError::Refused { counter },
        other => IngestError::Corrupt(other.to_string()),
    }
}

/// A stored counter below zero, which its column's `CHECK` forbids.
pub(super) fn negative_counter(table: &str, key: &str, column: &str, value: i64) -> GuardViolation {
    GuardViolation { table: table.to_owned(), key: key.to_owned(), column: column.to_owned(), value }
}

/// A value the core decided, for a `BIGINT` column. The core keeps values in
/// `DOMAIN`, so a failure here is an overflow the domain should have refused.
pub(super) fn db_i64(value: u64, counter: &'static str) -> Result<i64, Error> {
    i64::try_from(value).map_err(|_| Error::CounterOverflow { counter })
}

/// A journal entry's deltas as `BIGINT`s. Deltas between two counters of
/// PostgreSQL's domain (`0..=i64::MAX`) always fit; one that does not names
/// its counter.
pub(super) fn db_i64_delta(deltas: &tollgate_core::Deltas) -> Result<[i64; tollgate_core::COUNTERS], Error> {
    let mut out = [0i64; tollgate_core::COUNTERS];
    for ((slot, delta), counter) in out.iter_mut().zip(deltas).zip(tollgate_core::COUNTER_NAMES) {
        *slot = i64::try_from(*delta).map_err(|_| Error::CounterOverflow { counter })?;
    }
    Ok(out)
}

/// PostgreSQL text cannot hold NUL, so an identifier containing one cannot be
/// stored and is never found; it is not sent as a parameter either.
pub(super) fn storable(text: &str) -> bool {
    !text.contains('\0')
}

/// Whether PostgreSQL refused a write for its values' ranges (22: data
/// exception, such as `BIGINT` overflow; 23: integrity, such as a `CHECK`).
pub(super) fn out_of_range(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(db) => db.code().is_some_and(|code| code.starts_with("22") || code.starts_with("23")),
        _ => false,
    }
}
