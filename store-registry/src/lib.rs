//! The one list of store kinds: what `store.kind` and `store.labels` may
//! name, the `[store]` config section (each backend's section is its store
//! crate's own config type), and opening a record store of each kind. The
//! Label service, its operator's commands and its tests open stores here,
//! and so does idem-bench, which therefore needs nothing of the server.
//!
//! | kind           | labels         | records          | labels live in                  | label + record   | instances |
//! |----------------|----------------|------------------|---------------------------------|------------------|-----------|
//! | `embedded`     | `with_records` | embedded (fjall) | same store, effects subspace    | one transaction  | one       |
//! | `foundationdb` | `with_records` | FoundationDB     | same store, effects subspace    | one transaction  | many      |
//! | `postgres`     | `with_records` | PostgreSQL       | `labels` table, same database   | one transaction  | many      |
//! | `redis`        | `embedded`     | Redis            | embedded store (a local dir)    | separate commits | one       |
//! | `redis`        | `postgres`     | Redis            | `labels` table in PostgreSQL    | separate commits | many      |
//! | `memory`       | as `redis`     | a map in memory  | as `redis`                      | separate commits | one       |
//!
//! `memory` (store-memory, the reference store) is volatile and only in a
//! build with the `memory-store` feature, which the server's own tests turn
//! on; `foundationdb` only with the `foundationdb` feature (it links
//! FoundationDB's client library). Labels themselves are the server's: this
//! crate says where they may go, the server puts them there.
//!
//! Adding a backend: a [`StoreKind`] variant and its row in
//! [`StoreKind::facts`], its `[store.NAME]` field in [`StoreConfig`] (and its
//! checks in [`StoreConfig::validate`]), an [`OpenedStore`] variant and its
//! arm in [`open_store`].

mod config;
mod kind;
mod open;

pub use config::{FieldError, StoreConfig};
pub use kind::{KindFacts, LabelsKind, StoreKind};
pub use open::{BackendError, OpenedStore, migrate_postgres, open_embedded, open_postgres, open_store};
