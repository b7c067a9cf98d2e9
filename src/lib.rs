//! counter-gateway: an HTTP service that counts things, exactly.
//!
//! A request finds its way through these modules, in order:
//! - [`api`]: routes and thin handlers; bodies parsed into [`domain`] values;
//!   [`auth`] keys and roles say who may call what, on which tenant;
//! - [`tenant`]: each tenant's own store and pipeline;
//! - [`domain`]: counter keys, names, increments, time rules;
//! - [`pipeline`]: the bounded queue and the flusher that coalesces and
//!   group-commits every request that arrived while the last flush ran;
//! - [`store`]: the storage trait and its SQLite and Elasticsearch backends.
//!
//! [`error`] is the one error type of the API, [`config`] the command line,
//! [`actors`] the actor secret and the limits per actor,
//! [`server`] the start-up and orderly shutdown, [`kibana`] the Kibana
//! objects `setup` imports, [`transfer`] the `export`, `import` and
//! `migrate` commands.

pub mod actors;
pub mod api;
pub mod auth;
pub mod config;
pub mod domain;
pub mod error;
pub mod kibana;
pub mod metrics;
pub mod pipeline;
pub mod ratelimit;
pub mod server;
pub mod store;
pub mod tenant;
pub mod transfer;

pub use api::{gateway_app, gateway_router, router, AppState, Gateway, Limits};
