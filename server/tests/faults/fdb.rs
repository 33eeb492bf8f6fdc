//! FoundationDB as a real cluster: three `fdbserver` processes on the
//! stores' bridge address, all three coordinators, `double` redundancy, so
//! that one process can be killed and the database stays available.
//!
//! The binaries come from `IDEM_FDB_BIN_DIR` (scripts/test and
//! scripts/fault-campaign set it to the distribution scripts/foundationdb.sh
//! found), else from `PATH`.

use crate::history::LabelRow;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use test_support::child::TiedCommand;

/// Processes in the cluster.
const PROCESSES: usize = 3;
/// Names the folder holding `fdbserver` and `fdbcli`.
pub const BIN_DIR_VARIABLE: &str = "IDEM_FDB_BIN_DIR";
/// How long the new database may take to be available.
const AVAILABLE_WAIT_MS_MAX: u64 = 90_000;
/// fdbcli's own timeout for one command, in seconds.
const FDBCLI_TIMEOUT_S: &str = "60";

pub struct FdbCluster {
    bin_dir: PathBuf,
    address: Ipv4Addr,
    ports: Vec<u16>,
    processes: Vec<Option<Child>>,
    dir: PathBuf,
    cluster_file: PathBuf,
}

impl FdbCluster {
    pub async fn start(address: Ipv4Addr, parent: &Path) -> Self {
        let bin_dir = bin_dir();
        let dir = parent.join("foundationdb");
        std::fs::create_dir_all(&dir).expect("the cluster's directory");
        let ports: Vec<u16> = (0..PROCESSES)
            .map(|_| test_support::free_loopback_port().expect("a free port"))
            .collect();
        let coordinators: Vec<String> = ports.iter().map(|port| format!("{address}:{port}")).collect();
        let cluster_file = dir.join("fdb.cluster");
        let description = format!("idemfault:{:08x}@{}", rand::random::<u32>(), coordinators.join(","));
        std::fs::write(&cluster_file, description).expect("write the cluster file");
        let mut cluster = Self {
            bin_dir,
            address,
            ports,
            processes: (0..PROCESSES).map(|_| None).collect(),
            dir,
            cluster_file,
        };
        for index in 0..PROCESSES {
            cluster.restart(index);
        }
        tokio::task::block_in_place(|| cluster.configure());
        cluster
    }

    pub fn cluster_file(&self) -> &Path {
        &self.cluster_file
    }

    /// Kills process `index` (SIGKILL).
    pub fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.processes[index].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts process `index` on its port and data directory.
    pub fn restart(&mut self, index: usize) {
        self.kill(index);
        let (data, logs) = (
            self.dir.join(format!("data{index}")),
            self.dir.join(format!("logs{index}")),
        );
        for folder in [&data, &logs] {
            std::fs::create_dir_all(folder).expect("an fdbserver folder");
        }
        let mut server = TiedCommand::new(self.bin_dir.join("fdbserver"));
        server
            .command()
            .arg("-p")
            .arg(format!("{}:{}", self.address, self.ports[index]))
            .arg("-C")
            .arg(&self.cluster_file)
            .arg("-d")
            .arg(&data)
            .arg("-L")
            .arg(&logs)
            // `double` keeps each copy in another zone: on one host, every
            // process is a zone (and a machine) of its own, or the database
            // never becomes available.
            .arg(format!("--locality-zoneid=z{index}"))
            .arg(format!("--locality-machineid=m{index}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        self.processes[index] = Some(server.spawn().expect("start fdbserver"));
    }

    fn fdbcli(&self, command: &str) -> String {
        let output = Command::new(self.bin_dir.join("fdbcli"))
            .arg("-C")
            .arg(&self.cluster_file)
            .args(["--exec", command, "--timeout", FDBCLI_TIMEOUT_S])
            .output()
            .expect("run fdbcli");
        String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr)
    }

    fn configure(&self) {
        let configured = self.fdbcli("configure new double memory");
        assert!(
            configured.contains("Database created"),
            "fdbcli configure new double memory: {configured}"
        );
        let deadline = Instant::now() + Duration::from_millis(AVAILABLE_WAIT_MS_MAX);
        let mut status = String::new();
        while Instant::now() < deadline {
            status = self.fdbcli("status minimal");
            if status.contains("The database is available") {
                return;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        panic!("the three-process FoundationDB cluster was not available: {status}");
    }
}

impl Drop for FdbCluster {
    fn drop(&mut self) {
        for index in 0..PROCESSES {
            self.kill(index);
        }
    }
}

fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(BIN_DIR_VARIABLE) {
        return PathBuf::from(dir);
    }
    let on_path = std::env::var_os("PATH")
        .and_then(|path| std::env::split_paths(&path).find(|dir| dir.join("fdbserver").is_file()));
    on_path.unwrap_or_else(|| {
        panic!(
            "no fdbserver: set {BIN_DIR_VARIABLE} to FoundationDB's bin folder, or run the campaign through \
             scripts/test or scripts/fault-campaign, which find the distribution"
        )
    })
}

/// Every label row under the store's key prefix, read from this process.
pub async fn label_rows(cluster: &FdbCluster, prefix: &str) -> Vec<LabelRow> {
    use store_fdb::{Engine, RunOptions, Transaction};
    let env = vec![
        ("IDEM__STORE__KIND".to_owned(), "foundationdb".to_owned()),
        (
            "IDEM__STORE__FOUNDATIONDB__CLUSTER_FILE".to_owned(),
            format!("\"{}\"", cluster.cluster_file().display()),
        ),
        (
            "IDEM__STORE__FOUNDATIONDB__KEY_PREFIX".to_owned(),
            format!("\"{prefix}\""),
        ),
    ];
    let config = server::config::Config::load(None, env).expect("the cluster's config");
    let clock = store_core::SystemClock::shared();
    let store = match store_registry::open_store(&config.store, store_core::Policy::default(), &clock).await {
        Ok(server::backend::OpenedStore::Foundationdb(store)) => store,
        Ok(_) => panic!("a FoundationDB config opens FoundationDB"),
        Err(error) => panic!("open the FoundationDB store: {error}"),
    };
    let (begin, end) = store.layout().effects().subspace(&("label",)).range();
    let (begin, end) = (&begin, &end);
    let rows = store
        .engine()
        .run(RunOptions::default(), |tx, _| async move {
            Ok(tx.get_range(begin, end, 10_000_000).await?)
        })
        .await
        .expect("scan the labels");
    rows.into_iter()
        .map(|(_, value)| {
            let stored: server::labels::StoredLabel = serde_json::from_slice(&value).expect("a label row");
            LabelRow {
                caller: stored.caller.clone(),
                order_id: stored.label.order_id,
                parcel_no: stored.label.parcel_no,
                label_version: stored.label.label_version,
                label_id: stored.label.label_id,
            }
        })
        .collect()
}
