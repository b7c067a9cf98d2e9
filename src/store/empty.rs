//! The store of a tenant that holds no data: every read answers as an
//! empty store would, and nothing can be written.
//!
//! Reads of a tenant that was never written to are served from this, so a
//! read names a tenant without creating it (no database, no pipeline, no
//! slot among `--max-tenants`): a flood of reads of made-up tenant names
//! costs nothing that stays.

use async_trait::async_trait;

use super::{
    ActorMark, Average, AverageHistory, BatchOutcome, Bucket, CounterHistory, DaysOutcome,
    ImportBatch, ImportOutcome, StaleQuery, Store, StoreError, TopAverages, TopAveragesQuery,
    TopList, TopQuery, UnusedPair, WriteBatch,
};
use crate::domain::{Counter, CounterKey, CounterSet, DaySet, Window};

/// A store with no counters; see the module documentation.
#[derive(Clone, Copy, Debug, Default)]
pub struct EmptyStore;

/// Why an empty store refuses a write: writes open the tenant's real store
/// first, so reaching this is a bug in the caller, never the client's doing.
const NO_WRITES: &str = "a tenant without data takes no writes here; writes open its store";

#[async_trait]
impl Store for EmptyStore {
    async fn apply(&self, _batch: WriteBatch) -> Result<BatchOutcome, StoreError> {
        Err(StoreError::Internal(NO_WRITES.into()))
    }

    async fn sync(&self) -> Result<(), StoreError> {
        Err(StoreError::Internal(NO_WRITES.into()))
    }

    async fn get(&self, _key: &CounterKey) -> Result<Option<Counter>, StoreError> {
        Ok(None)
    }

    async fn target_counters(
        &self,
        _entity: &str,
        _uuid: &str,
    ) -> Result<Vec<Counter>, StoreError> {
        Ok(Vec::new())
    }

    async fn delete(&self, _key: &CounterKey) -> Result<bool, StoreError> {
        Ok(false)
    }

    async fn ready(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn histogram(
        &self,
        _key: &CounterKey,
        _window: Window,
    ) -> Result<Option<Vec<Bucket>>, StoreError> {
        Ok(None)
    }

    async fn hour_histogram(
        &self,
        _key: &CounterKey,
        _hours: crate::domain::HourRange,
    ) -> Result<Option<crate::store::HourHistogram>, StoreError> {
        Ok(None)
    }

    async fn top_hours(&self, _query: &crate::store::TopHoursQuery) -> Result<TopList, StoreError> {
        Ok(TopList {
            entries: Vec::new(),
            exact: true,
        })
    }

    async fn trending(
        &self,
        _query: &crate::store::TrendingQuery,
    ) -> Result<crate::store::TrendingList, StoreError> {
        Ok(crate::store::TrendingList {
            entries: Vec::new(),
            exact: true,
        })
    }

    async fn top(&self, _query: &TopQuery) -> Result<TopList, StoreError> {
        Ok(TopList {
            entries: Vec::new(),
            exact: true,
        })
    }

    async fn stale(&self, _query: &StaleQuery) -> Result<Vec<Counter>, StoreError> {
        Ok(Vec::new())
    }

    async fn unused(&self, _before_ms: i64) -> Result<Vec<UnusedPair>, StoreError> {
        Ok(Vec::new())
    }

    async fn average(
        &self,
        _key: &CounterKey,
        _window: Option<Window>,
    ) -> Result<Option<Average>, StoreError> {
        Ok(None)
    }

    async fn top_averages(&self, _query: &TopAveragesQuery) -> Result<TopAverages, StoreError> {
        Ok(TopAverages::by_average(Vec::new(), true))
    }

    async fn get_many(&self, keys: &[CounterKey]) -> Result<Vec<Option<Counter>>, StoreError> {
        Ok(vec![None; keys.len()])
    }

    async fn set_days(
        &self,
        _sets: Vec<DaySet>,
        _oldest_day: i64,
    ) -> Result<DaysOutcome, StoreError> {
        Err(StoreError::Internal(NO_WRITES.into()))
    }

    async fn set_value(&self, _set: CounterSet) -> Result<Counter, StoreError> {
        Err(StoreError::Internal(NO_WRITES.into()))
    }

    async fn counter_page(
        &self,
        _after: Option<CounterKey>,
        _limit: usize,
        _from_day: i64,
        _hours_from_day: i64,
    ) -> Result<Vec<CounterHistory>, StoreError> {
        Ok(Vec::new())
    }

    async fn average_page(
        &self,
        _after: Option<CounterKey>,
        _limit: usize,
        _from_day: i64,
    ) -> Result<Vec<AverageHistory>, StoreError> {
        Ok(Vec::new())
    }

    async fn mark_page(
        &self,
        _after: Option<ActorMark>,
        _limit: usize,
        _from_day: i64,
    ) -> Result<Vec<ActorMark>, StoreError> {
        Ok(Vec::new())
    }

    async fn import(&self, _batch: ImportBatch) -> Result<ImportOutcome, StoreError> {
        Err(StoreError::Internal(NO_WRITES.into()))
    }

    async fn set_published(&self, _sets: Vec<super::PublishedSet>) -> Result<(), StoreError> {
        Err(StoreError::Internal(NO_WRITES.into()))
    }

    async fn published(&self, _entity: &str, _uuid: &str) -> Result<Option<i64>, StoreError> {
        Ok(None)
    }

    async fn top_first_days(
        &self,
        _query: &super::FirstDaysQuery,
    ) -> Result<super::FirstDaysList, StoreError> {
        Ok(super::FirstDaysList {
            entries: Vec::new(),
            exact: true,
        })
    }

    async fn top_first_days_local(
        &self,
        _query: &super::LocalFirstDaysQuery,
    ) -> Result<super::FirstDaysList, StoreError> {
        Ok(super::FirstDaysList {
            entries: Vec::new(),
            exact: true,
        })
    }

    async fn countapi_records(
        &self,
        _namespace: &str,
        _key: &str,
    ) -> Result<crate::domain::countapi::Records, StoreError> {
        Ok(Default::default())
    }

    async fn countapi_create(
        &self,
        _creation: crate::domain::countapi::Creation,
    ) -> Result<crate::domain::countapi::Created, StoreError> {
        Err(StoreError::Internal(NO_WRITES.into()))
    }

    async fn countapi_page(
        &self,
        _after: Option<(String, String)>,
        _limit: usize,
    ) -> Result<Vec<crate::domain::countapi::KeyRecord>, StoreError> {
        Ok(Vec::new())
    }

    async fn published_page(
        &self,
        _after: Option<(String, String)>,
        _limit: usize,
    ) -> Result<Vec<super::TargetPublished>, StoreError> {
        Ok(Vec::new())
    }
}
