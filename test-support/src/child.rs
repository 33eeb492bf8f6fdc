//! Child processes that end with the process that started them, however it
//! ends: a clean exit, a panic, or a SIGKILL that leaves it no chance to
//! clean up. A server left running by a test or a benchmark holds its port,
//! its data directory and its store connections, and takes CPU from the
//! next run on the same cores.
//!
//! On Linux the kernel does it: `prctl(PR_SET_PDEATHSIG, SIGKILL)` in the
//! child, set by util-linux's `setpriv --pdeathsig KILL`, which then
//! executes the program itself (same process id, same command line after
//! it). Setting it from Rust would need `CommandExt::pre_exec`, which is
//! `unsafe`, and the workspace forbids `unsafe_code`; `setpriv` is part of
//! util-linux, which every Debian system has (it is an essential package).
//!
//! The kernel sends the signal when the *thread* that forked the child
//! ends, not the process: a child forked from a short-lived thread (a
//! tokio blocking-pool thread, which ends after 10 s idle) would be killed
//! in the middle of a run. So every [`TiedCommand`] is spawned from one
//! thread that lives as long as the process.
//!
//! Each child also gets a process group of its own: a Ctrl-C at the
//! terminal then reaches the parent alone, which stops its children in its
//! own order (the load first, the services after) instead of all at once.

use std::ffi::OsStr;
use std::io;
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

/// The util-linux program that sets the death signal and runs the command.
pub const DEATH_SIGNAL_WRAPPER: &str = "setpriv";
/// Its arguments before the program: SIGKILL, as a child that outlives its
/// parent has nobody left to stop it cleanly.
const DEATH_SIGNAL_ARGUMENTS: [&str; 3] = ["--pdeathsig", "KILL", "--"];
/// Spawn requests waiting for the spawning thread; more callers wait.
const SPAWN_REQUESTS_MAX: usize = 64;
/// The spawning thread's name (it shows in `ps -T` and in a core dump).
const SPAWNER_THREAD_NAME: &str = "child-spawner";

type SpawnRequest = (Command, SyncSender<io::Result<Child>>);

/// A command whose process is killed by the kernel when this process ends.
pub struct TiedCommand {
    command: Command,
}

impl TiedCommand {
    /// `program`, run through [`DEATH_SIGNAL_WRAPPER`] when it is installed
    /// (without it, the child is spawned as usual and a warning says once
    /// that it may outlive this process).
    pub fn new(program: impl AsRef<OsStr>) -> Self {
        let mut command = match death_signal_wrapper_installed() {
            true => {
                let mut command = Command::new(DEATH_SIGNAL_WRAPPER);
                command.args(DEATH_SIGNAL_ARGUMENTS).arg(program.as_ref());
                command
            }
            false => Command::new(program.as_ref()),
        };
        command.process_group(0);
        Self { command }
    }

    /// The command, for its arguments, environment, directory and streams.
    pub fn command(&mut self) -> &mut Command {
        &mut self.command
    }

    /// Starts the process from the long-lived spawning thread.
    pub fn spawn(self) -> io::Result<Child> {
        let requests = spawner()?;
        let (reply, answer) = sync_channel(1);
        requests
            .send((self.command, reply))
            .map_err(|_| io::Error::other("the child-spawning thread has ended"))?;
        answer
            .recv()
            .map_err(|_| io::Error::other("the child-spawning thread did not answer"))?
    }
}

/// Whether children get a death signal here ([`DEATH_SIGNAL_WRAPPER`] on PATH).
pub fn death_signal_wrapper_installed() -> bool {
    static INSTALLED: OnceLock<bool> = OnceLock::new();
    *INSTALLED.get_or_init(|| {
        let installed = std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(DEATH_SIGNAL_WRAPPER).is_file()));
        if !installed {
            eprintln!(
                "warning: {DEATH_SIGNAL_WRAPPER} (util-linux) is not on PATH: child processes will outlive this one if it is killed"
            );
        }
        installed
    })
}

/// The sending end of the spawning thread's queue; the thread is started on
/// first use and, the sender being kept in a static, never ends before the
/// process does.
fn spawner() -> io::Result<&'static SyncSender<SpawnRequest>> {
    static SPAWNER: OnceLock<SyncSender<SpawnRequest>> = OnceLock::new();
    if let Some(requests) = SPAWNER.get() {
        return Ok(requests);
    }
    let (requests, queue) = sync_channel(SPAWN_REQUESTS_MAX);
    std::thread::Builder::new()
        .name(SPAWNER_THREAD_NAME.to_owned())
        .spawn(move || spawn_each(queue))?;
    // Two first callers may race: the loser's thread finds its queue
    // closed and ends at once, having spawned nothing.
    Ok(SPAWNER.get_or_init(|| requests))
}

fn spawn_each(queue: Receiver<SpawnRequest>) {
    for (mut command, reply) in queue {
        let _ = reply.send(command.spawn());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tied_child_is_in_a_process_group_of_its_own() {
        let mut sleeper = TiedCommand::new("sleep");
        sleeper.command().arg("30");
        let mut child = sleeper.spawn().expect("spawn sleep");
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", child.id())).expect("its stat");
        // Fields after the command name: state, parent, process group.
        let group: u32 = stat
            .rsplit(')')
            .next()
            .unwrap()
            .split_whitespace()
            .nth(2)
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(group, child.id());
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
