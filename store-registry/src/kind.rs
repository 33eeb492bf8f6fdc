//! The store kinds (`store.kind`) and where the application's effects live
//! beside them (`store.labels`). What sets one kind apart from another is
//! one table, [`StoreKind::facts`]; every other question about a kind reads
//! it.

use serde::Deserialize;

/// Where records live (`store.kind`): the one list of backends the Label
/// service, its tests and idem-bench share (the bench's `--backend` and
/// `--store-kind` parse it too, with the `clap` feature).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, serde::Serialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "clap", value(rename_all = "lowercase"))]
pub enum StoreKind {
    Embedded,
    Redis,
    Postgres,
    Foundationdb,
    /// The reference store in memory (store-memory): volatile, for tests;
    /// only with the `memory-store` feature, and never a bench backend.
    #[cfg_attr(feature = "clap", value(skip))]
    Memory,
}

/// What one kind is: its row of the table in [`StoreKind::facts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KindFacts {
    /// Its name in the config (`store.kind`) and on the command line.
    pub name: &'static str,
    /// The cargo feature that builds it in, for the kinds a default build
    /// leaves out (the same name on this crate, the server and the bench).
    pub cargo_feature: Option<&'static str>,
    /// Why a default build leaves it out, said when it is refused.
    pub left_out_because: &'static str,
    /// True when this build can open it.
    pub is_built: bool,
    /// True when the store can commit an effect (a label) in the record's
    /// own transaction; the others keep effects apart (`store.labels`).
    pub holds_effects: bool,
    /// Where its records are, for a startup log line.
    pub records_where: &'static str,
}

impl StoreKind {
    /// Every kind, whether or not this build has it ([`StoreKind::is_built`]).
    pub const ALL: [StoreKind; 5] = [
        StoreKind::Embedded,
        StoreKind::Redis,
        StoreKind::Postgres,
        StoreKind::Foundationdb,
        StoreKind::Memory,
    ];

    /// The durable kinds a test or the bench runs on this machine alone:
    /// the embedded store, and Redis and PostgreSQL on servers their
    /// testkits start. Not FoundationDB (it needs a cluster nobody here
    /// starts, and the default build leaves it out), not memory (volatile).
    pub const SELF_STARTED: [StoreKind; 3] = [StoreKind::Embedded, StoreKind::Redis, StoreKind::Postgres];

    /// The table of kinds: everything that sets one apart, in one place.
    pub const fn facts(self) -> KindFacts {
        match self {
            StoreKind::Embedded => KindFacts {
                name: "embedded",
                cargo_feature: None,
                left_out_because: "",
                is_built: true,
                holds_effects: true,
                records_where: "records in the embedded store",
            },
            StoreKind::Redis => KindFacts {
                name: "redis",
                cargo_feature: None,
                left_out_because: "",
                is_built: true,
                holds_effects: false,
                records_where: "records in Redis",
            },
            StoreKind::Postgres => KindFacts {
                name: "postgres",
                cargo_feature: None,
                left_out_because: "",
                is_built: true,
                holds_effects: true,
                records_where: "records in PostgreSQL",
            },
            StoreKind::Foundationdb => KindFacts {
                name: "foundationdb",
                cargo_feature: Some("foundationdb"),
                left_out_because: " (needs FoundationDB's client library libfdb_c at link time and run time)",
                is_built: cfg!(feature = "foundationdb"),
                holds_effects: true,
                records_where: "records in FoundationDB",
            },
            StoreKind::Memory => KindFacts {
                name: "memory",
                cargo_feature: Some("memory-store"),
                left_out_because: ": a volatile store for tests and examples, never for production",
                is_built: cfg!(feature = "memory-store"),
                holds_effects: false,
                records_where: "records in memory (volatile: lost at exit; for tests)",
            },
        }
    }

    pub fn name(self) -> &'static str {
        self.facts().name
    }

    /// The cargo feature that builds this kind in, for the ones a default
    /// build leaves out.
    pub fn cargo_feature(self) -> Option<&'static str> {
        self.facts().cargo_feature
    }

    /// True when this build can open the kind.
    pub fn is_built(self) -> bool {
        self.facts().is_built
    }

    /// True when the records' store can commit a label in the record's
    /// own transaction; the others keep labels apart (embedded or
    /// PostgreSQL, `store.labels`).
    pub fn holds_labels(self) -> bool {
        self.facts().holds_effects
    }
}

impl std::str::FromStr for StoreKind {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        StoreKind::ALL
            .into_iter()
            .find(|kind| kind.name() == name)
            .ok_or_else(|| format!("unknown store kind {name:?}"))
    }
}

impl std::fmt::Display for StoreKind {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.name())
    }
}

/// Where labels (the business effect) live, beside the records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LabelsKind {
    /// In the records' own store, committed in one transaction with the
    /// record (embedded, FoundationDB, PostgreSQL).
    WithRecords,
    /// In the embedded store beside a Redis record store: two commits, one
    /// instance only (the embedded store is a local directory).
    Embedded,
    /// In PostgreSQL (`[store.postgres]`) beside a Redis record store: two
    /// commits, shared by every instance.
    Postgres,
}

impl LabelsKind {
    pub fn name(self) -> &'static str {
        match self {
            LabelsKind::WithRecords => "with_records",
            LabelsKind::Embedded => "embedded",
            LabelsKind::Postgres => "postgres",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_named_once_and_parses_back() {
        for kind in StoreKind::ALL {
            assert_eq!(kind.name().parse::<StoreKind>(), Ok(kind));
            assert_eq!(
                StoreKind::ALL
                    .iter()
                    .filter(|other| other.name() == kind.name())
                    .count(),
                1
            );
        }
        assert!("fjall".parse::<StoreKind>().is_err());
    }

    /// The kinds the default build leaves out are the ones with a feature.
    #[test]
    fn a_kind_without_a_feature_is_always_built() {
        for kind in StoreKind::ALL {
            if kind.cargo_feature().is_none() {
                assert!(kind.is_built(), "{kind}");
                assert!(kind.facts().left_out_because.is_empty(), "{kind}");
            } else {
                assert!(!kind.facts().left_out_because.is_empty(), "{kind}");
            }
        }
    }
}
