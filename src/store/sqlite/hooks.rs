//! Test hooks of the embedded store, compiled only for the crate's own tests
//! (the `test-hooks` feature, which the crate's dev-dependency on itself
//! turns on): without it [`Hooks`] is empty and its checks are constant
//! `false`, so a release build carries neither the fields nor the checks.

#[cfg(any(test, feature = "test-hooks"))]
pub use armed::{FoldHold, FsyncFault, WriterSql};

/// What a store's code asks of its hooks.
#[derive(Clone, Debug, Default)]
pub(super) struct Hooks {
    /// While armed, the WAL fsync fails as a full or failing disk would.
    #[cfg(any(test, feature = "test-hooks"))]
    pub fsync_fault: FsyncFault,
    /// While held, the change log is folded only where a read needs it.
    #[cfg(any(test, feature = "test-hooks"))]
    pub fold_hold: FoldHold,
}

#[cfg(any(test, feature = "test-hooks"))]
impl Hooks {
    /// Nothing folds on its own (after flushes, in the background, at
    /// close); lists and reports still fold what they need.
    pub(super) fn fold_held(&self) -> bool {
        self.fold_hold.held()
    }

    /// The next fsync fails with `EIO`.
    pub(super) fn fsync_fails(&self) -> bool {
        self.fsync_fault.armed()
    }
}

#[cfg(not(any(test, feature = "test-hooks")))]
impl Hooks {
    #[inline(always)]
    pub(super) fn fold_held(&self) -> bool {
        false
    }

    #[inline(always)]
    pub(super) fn fsync_fails(&self) -> bool {
        false
    }
}

#[cfg(any(test, feature = "test-hooks"))]
mod armed {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex, Weak};

    use super::super::{SqliteStore, Writer};
    use crate::store::StoreError;

    /// A hook for tests: while held, the change log is folded only where a
    /// read needs it (lists, reports, deletes, backfills), window totals stay
    /// in memory, and the table of the day after is not filled (but by
    /// [`SqliteStore::catch_up`]), so a test can read counters whose deltas are
    /// logged and not folded or whose totals only memory holds, cross midnight
    /// before the copy is done, or leave all that to a crash.
    #[derive(Clone, Debug, Default)]
    pub struct FoldHold(Arc<AtomicBool>);

    impl FoldHold {
        pub fn hold(&self) {
            self.0.store(true, Ordering::SeqCst);
        }

        pub fn release(&self) {
            self.0.store(false, Ordering::SeqCst);
        }

        pub(super) fn held(&self) -> bool {
            self.0.load(Ordering::SeqCst)
        }
    }

    /// A fault hook for tests: while armed, [`Store::sync`](crate::store::Store::sync) fails as if the
    /// kernel had reported an fsync error (`EIO`), without touching the disk.
    #[derive(Clone, Debug, Default)]
    pub struct FsyncFault(Arc<AtomicBool>);

    impl FsyncFault {
        pub fn arm(&self) {
            self.0.store(true, Ordering::SeqCst);
        }

        pub fn disarm(&self) {
            self.0.store(false, Ordering::SeqCst);
        }

        pub(super) fn armed(&self) -> bool {
            self.0.load(Ordering::SeqCst)
        }
    }

    /// A hook for tests: SQL run on the store's writer connection, to give
    /// it the state a disk or a file would (`PRAGMA max_page_count`: no room
    /// for one page more, as a full disk; `PRAGMA query_only`: a read-only
    /// database, which file modes cannot make for root, who runs the tests).
    #[derive(Clone)]
    pub struct WriterSql(Weak<Mutex<Writer>>);

    impl WriterSql {
        /// Runs `sql` on the writer, between two flushes; panics if the store
        /// is closed or SQLite refuses it.
        pub fn run(&self, sql: &str) {
            let writer = self.0.upgrade().expect("the store is open");
            let w = writer.lock().expect("the writer lock");
            w.conn.execute_batch(sql).expect("the hook's SQL");
        }
    }

    impl SqliteStore {
        /// The hook that runs SQL on this store's writer (tests).
        pub fn writer_sql(&self) -> WriterSql {
            WriterSql(Arc::downgrade(&self.writer))
        }

        /// Folds the whole change log, writes every window total memory holds
        /// back to the kept tables, and brings those to today (the day's flip,
        /// the table of the day after complete, or a rebuild), however long
        /// that takes, in one hold of the writer. Lists never need it (they are
        /// exact at every moment); a test that reads the tables, or that wants
        /// them complete before crossing midnight, calls it.
        pub async fn catch_up(&self) -> Result<(), StoreError> {
            let today = self.today();
            self.with_writer(move |w| {
                w.fold_all()?;
                w.write_back_bulk()?;
                w.write_back_all()?;
                while w.windows_step(today, true)? {}
                Ok(())
            })
            .await
        }

        /// The hook that makes this store's fsyncs fail while armed (tests).
        pub fn fsync_fault(&self) -> FsyncFault {
            self.hooks.fsync_fault.clone()
        }

        /// The hook that keeps this store from folding on its own (tests).
        pub fn fold_hold(&self) -> FoldHold {
            self.hooks.fold_hold.clone()
        }
    }
}
