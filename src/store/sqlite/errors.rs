//! SQLite's errors kept whole: each failure of a statement becomes a
//! [`StoreError::Sqlite`] that names the operation (the function that ran
//! it), keeps rusqlite's error as its source, and sorts its result code
//! into a [`StoreErrorKind`], so that a busy, full, read-only or corrupt
//! database is told apart in the log, in `/metrics` and in the answer's
//! `type`, while the client still gets none of SQLite's text.

use rusqlite::ErrorCode;

use crate::store::{StoreError, StoreErrorKind};

/// The conversion for `map_err`: SQLite failed in `op`.
pub(super) fn sql(op: &'static str) -> impl Fn(rusqlite::Error) -> StoreError {
    move |source| StoreError::Sqlite {
        op,
        kind: kind_of(&source),
        source,
    }
}

/// The kind of a SQLite error, by its primary result code (an extended
/// code, `SQLITE_BUSY_SNAPSHOT` say, sorts with its primary one). Errors
/// that are no result of SQLite's (a column of an unexpected type, no row)
/// are bugs of ours: `Other`.
pub(super) fn kind_of(e: &rusqlite::Error) -> StoreErrorKind {
    match e.sqlite_error_code() {
        // Another connection holds the lock past the busy timeout.
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => StoreErrorKind::Busy,
        // The disk, or the database's page limit.
        Some(ErrorCode::DiskFull) => StoreErrorKind::Full,
        Some(ErrorCode::ReadOnly) => StoreErrorKind::ReadOnly,
        Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => StoreErrorKind::Corrupt,
        _ => StoreErrorKind::Other,
    }
}

#[cfg(test)]
mod tests {
    use rusqlite::ffi;

    use super::*;

    fn failure(code: i32) -> rusqlite::Error {
        rusqlite::Error::SqliteFailure(ffi::Error::new(code), None)
    }

    /// Every result code SQLite may answer a statement with, primary and
    /// extended, lands in the kind the answer's `type` is made from.
    #[test]
    fn each_sqlite_code_maps_to_its_kind() {
        use StoreErrorKind::*;
        let cases = [
            (ffi::SQLITE_BUSY, Busy),
            (ffi::SQLITE_BUSY_SNAPSHOT, Busy),
            (ffi::SQLITE_BUSY_RECOVERY, Busy),
            (ffi::SQLITE_BUSY | (3 << 8), Busy), // SQLITE_BUSY_TIMEOUT,
            (ffi::SQLITE_LOCKED, Busy),
            (ffi::SQLITE_LOCKED_SHAREDCACHE, Busy),
            (ffi::SQLITE_FULL, Full),
            (ffi::SQLITE_READONLY, ReadOnly),
            (ffi::SQLITE_READONLY_DBMOVED, ReadOnly),
            (ffi::SQLITE_READONLY_RECOVERY, ReadOnly),
            (ffi::SQLITE_READONLY | (6 << 8), ReadOnly), // SQLITE_READONLY_DIRECTORY,
            (ffi::SQLITE_CORRUPT, Corrupt),
            (ffi::SQLITE_CORRUPT | (3 << 8), Corrupt), // SQLITE_CORRUPT_INDEX,
            (ffi::SQLITE_NOTADB, Corrupt),
            (ffi::SQLITE_IOERR, Other),
            (ffi::SQLITE_IOERR_FSYNC, Other),
            (ffi::SQLITE_CANTOPEN, Other),
            (ffi::SQLITE_CONSTRAINT, Other),
            (ffi::SQLITE_NOMEM, Other),
            (ffi::SQLITE_MISUSE, Other),
            (ffi::SQLITE_ERROR, Other),
        ];
        for (code, kind) in cases {
            assert_eq!(kind_of(&failure(code)), kind, "code {code}");
        }
        assert_eq!(kind_of(&rusqlite::Error::QueryReturnedNoRows), Other);
        assert_eq!(
            kind_of(&rusqlite::Error::InvalidColumnType(
                0,
                "value".into(),
                rusqlite::types::Type::Text
            )),
            Other
        );
    }

    /// The error keeps its operation and SQLite's own error as its source,
    /// so the log's chain has both.
    #[test]
    fn the_error_keeps_its_operation_and_source() {
        let e = sql("fold::chunk")(failure(ffi::SQLITE_FULL));
        assert_eq!(e.kind(), StoreErrorKind::Full);
        let text = e.to_string();
        assert!(text.contains("fold::chunk"), "{text}");
        let source = std::error::Error::source(&e).expect("a source");
        let sqlite = source
            .downcast_ref::<rusqlite::Error>()
            .expect("rusqlite's");
        assert_eq!(sqlite.sqlite_error_code(), Some(ErrorCode::DiskFull));
    }

    /// A real database past its page limit answers SQLITE_FULL, and one
    /// opened read-only SQLITE_READONLY: the codes the table above sorts.
    #[test]
    fn a_full_and_a_read_only_database_answer_their_kinds() {
        let c = rusqlite::Connection::open_in_memory().unwrap();
        c.execute_batch("CREATE TABLE t (v BLOB); PRAGMA max_page_count = 2")
            .unwrap();
        let full = c
            .execute("INSERT INTO t VALUES (zeroblob(100000))", [])
            .map_err(sql("test::full"))
            .unwrap_err();
        assert_eq!(full.kind(), StoreErrorKind::Full, "{full}");
        c.execute_batch("PRAGMA query_only = ON").unwrap();
        let read_only = c
            .execute("INSERT INTO t VALUES (1)", [])
            .map_err(sql("test::read_only"))
            .unwrap_err();
        assert_eq!(read_only.kind(), StoreErrorKind::ReadOnly, "{read_only}");
    }
}
