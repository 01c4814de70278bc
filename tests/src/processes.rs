//! Worker processes that start their load together: a barrier across processes. Each worker
//! sets itself up (connects, migrates), prints [`READY`] and waits for a line on its stdin; the
//! parent releases all of them at once when every one has said it is ready. No agreed start time,
//! so a slow machine cannot make a worker start late, or early.
//!
//! And a [`Victim`]: a worker process killed (`kill -9`) once it has said (a line on its stdout,
//! [`say`]) that it is where the test wants it to die.

use std::fmt::Display;
use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::task::JoinHandle;

/// How long a worker may take to set itself up.
const SET_UP: std::time::Duration = std::time::Duration::from_secs(120);

/// The line a worker prints when it is set up and waiting.
pub const READY: &str = "WORKER READY";

/// In a worker: says it is ready, then waits until the parent lets it go.
pub async fn ready_then_wait() {
    println!("{READY}");
    std::io::Write::flush(&mut std::io::stdout()).expect("flush stdout");
    let mut line = String::new();
    BufReader::new(tokio::io::stdin())
        .read_line(&mut line)
        .await
        .expect("the parent's go line");
}

/// The full name of this test binary's test `test` (`faults::kill9_worker` for `kill9_worker`):
/// the integration tests are modules of one binary, so a worker is found by its last segment.
///
/// # Panics
/// If the binary cannot list its tests, or none or several end in `test`.
pub fn test_path(test: &str) -> String {
    use std::sync::OnceLock;
    static LIST: OnceLock<Vec<String>> = OnceLock::new();
    let list = LIST.get_or_init(|| {
        let exe = std::env::current_exe().expect("the test binary");
        let out = std::process::Command::new(exe)
            .args(["--list", "--format", "terse"])
            .output()
            .expect("list the tests");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_suffix(": test"))
            .map(String::from)
            .collect()
    });
    let found: Vec<&String> = list
        .iter()
        .filter(|name| *name == test || name.ends_with(&format!("::{test}")))
        .collect();
    match found.as_slice() {
        [one] => (*one).clone(),
        _ => panic!(
            "{} tests of this binary end in `{test}`: {found:?}",
            found.len()
        ),
    }
}

/// What a worker printed, and how it ended.
#[derive(Debug)]
pub struct Finished {
    /// Its stdout after [`READY`].
    pub stdout: String,
    /// Its whole stderr.
    pub stderr: String,
    /// Whether it exited with success.
    pub success: bool,
}

#[derive(Debug)]
struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: JoinHandle<String>,
    stderr: JoinHandle<String>,
}

/// A command that runs this test binary's `test` alone as worker number `replica` (given to it
/// in the environment variable `id_env`), its output not captured.
///
/// # Panics
/// If the test binary's path cannot be read.
pub fn worker_command(test: &str, id_env: &str, replica: usize) -> Command {
    let exe = std::env::current_exe().expect("the test binary");
    let mut command = Command::new(exe);
    command
        .args([
            "--exact",
            &test_path(test),
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(id_env, replica.to_string());
    command
}

/// Workers released together.
#[derive(Debug)]
pub struct Workers(Vec<Worker>);

impl Workers {
    /// Spawns every command (its stdio piped, killed if dropped), waits until each has printed
    /// [`READY`], then lets all of them go. Panics, with what the worker printed, if one exits
    /// before it is ready.
    pub async fn start_together(commands: Vec<Command>) -> Workers {
        let mut workers = Vec::new();
        let mut ready = Vec::new();
        for mut command in commands {
            let mut child = command
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .expect("spawn a worker");
            let stdin = child.stdin.take().expect("piped stdin");
            let mut lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
            let mut stderr_pipe = child.stderr.take().expect("piped stderr");
            // Drained from the start, so a chatty worker never blocks on a full pipe.
            let stderr = tokio::spawn(async move {
                let mut all = String::new();
                let _ = stderr_pipe.read_to_string(&mut all).await;
                all
            });
            let (tx, rx) = tokio::sync::oneshot::channel::<bool>();
            let stdout = tokio::spawn(async move {
                let mut tx = Some(tx);
                let mut after = String::new();
                while let Ok(Some(line)) = lines.next_line().await {
                    // The test harness may have printed "test NAME ... " on the same line.
                    if line.ends_with(READY) {
                        if let Some(tx) = tx.take() {
                            let _ = tx.send(true);
                        }
                        continue;
                    }
                    if tx.is_none() {
                        after.push_str(&line);
                        after.push('\n');
                    }
                }
                after
            });
            ready.push(rx);
            workers.push(Worker {
                child,
                stdin,
                stdout,
                stderr,
            });
        }
        for (i, rx) in ready.into_iter().enumerate() {
            // A bound, not a pause: a worker that hangs in its set-up fails the test.
            let said = tokio::time::timeout(SET_UP, rx).await;
            if !matches!(said, Ok(Ok(true))) {
                let mut w = workers.swap_remove(i);
                let _ = w.child.start_kill();
                let status = w.child.wait().await;
                let stderr = w.stderr.await.unwrap_or_default();
                panic!("worker {i} was not ready within {SET_UP:?} ({status:?}):\n{stderr}");
            }
        }
        for w in &mut workers {
            w.stdin.write_all(b"go\n").await.expect("release a worker");
            w.stdin.flush().await.expect("release a worker");
        }
        Workers(workers)
    }

    /// Waits for every worker to exit, in the order they were given.
    pub async fn finish(self) -> Vec<Finished> {
        let mut out = Vec::new();
        for mut w in self.0 {
            let status = w.child.wait().await.expect("a worker's exit");
            out.push(Finished {
                stdout: w.stdout.await.unwrap_or_default(),
                stderr: w.stderr.await.unwrap_or_default(),
                success: status.success(),
            });
        }
        out
    }
}

/// How one worker's calls were answered, reported on its stdout as a `TALLY` line and summed by
/// the parent ([`Tally::total`]).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Tally {
    /// Calls that ran the handler.
    pub fresh: usize,
    /// Calls answered with the stored answer.
    pub replayed: usize,
    /// Calls told the call is in progress.
    pub in_flight: usize,
    /// Anything else (printed to stderr as it happens).
    pub other: usize,
}

impl Tally {
    /// Counts one call's outcome; `in_flight` says whether an error is the in-progress answer.
    pub fn count<T, E: std::fmt::Display>(
        &mut self,
        worker: usize,
        out: &idempotency::outcome::Outcome<T, E>,
        in_flight: impl Fn(&E) -> bool,
    ) {
        match &out.result {
            Ok(_) if out.replayed => self.replayed += 1,
            Ok(_) => self.fresh += 1,
            Err(e) if in_flight(e) => self.in_flight += 1,
            Err(e) => {
                eprintln!("worker {worker}: unexpected answer: {e}");
                self.other += 1;
            }
        }
    }

    /// In the parent: all `calls` calls were answered, exactly one ran the handler, and every
    /// other got the charge or an honest in-progress answer.
    pub fn assert_one_run(&self, calls: usize) {
        assert_eq!(
            self.fresh + self.replayed + self.in_flight + self.other,
            calls
        );
        assert_eq!(self.fresh, 1, "one call ran the handler");
        assert_eq!(
            self.other, 0,
            "every call got the charge or an honest in-progress answer"
        );
    }

    /// In a worker: prints the tally for the parent.
    pub fn report(&self, worker: usize) {
        println!(
            "TALLY worker={worker} fresh={} replayed={} in_flight={} other={}",
            self.fresh, self.replayed, self.in_flight, self.other
        );
    }

    fn parse(line: &str) -> Option<Tally> {
        // The test harness may have printed "test NAME ... " on the same line.
        let rest = &line[line.find("TALLY ")? + "TALLY ".len()..];
        let mut t = Tally::default();
        for field in rest.split_whitespace() {
            let (name, value) = field.split_once('=')?;
            let value: usize = value.parse().ok()?;
            match name {
                "fresh" => t.fresh = value,
                "replayed" => t.replayed = value,
                "in_flight" => t.in_flight = value,
                "other" => t.other = value,
                _ => {}
            }
        }
        Some(t)
    }

    /// In the parent: checks that every worker succeeded and reported a tally, and sums them.
    pub fn total(finished: Vec<Finished>) -> Tally {
        let mut total = Tally::default();
        for (worker, out) in finished.into_iter().enumerate() {
            let stdout = &out.stdout;
            assert!(
                out.success,
                "worker {worker} failed:\n{stdout}\n{}",
                out.stderr
            );
            let t = stdout
                .lines()
                .find_map(Tally::parse)
                .unwrap_or_else(|| panic!("worker {worker} reported no tally:\n{stdout}"));
            println!("worker {worker}: {t:?}");
            total.fresh += t.fresh;
            total.replayed += t.replayed;
            total.in_flight += t.in_flight;
            total.other += t.other;
        }
        total
    }
}

/// In a worker: prints `marker value` on a line of its own and flushes it, for the parent's
/// [`Victim::said`].
pub fn say(marker: &str, value: impl Display) {
    println!("{marker} {value}");
    std::io::Write::flush(&mut std::io::stdout()).expect("flush stdout");
}

/// A worker process to be killed mid-call: this test binary run again as the one test `test`
/// (which does nothing unless its environment says it is the worker), stdout read line by line,
/// stderr kept for the failure message.
#[derive(Debug)]
pub struct Victim {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Lines<BufReader<ChildStdout>>,
    /// Lines read so far.
    seen: Vec<String>,
    stderr: JoinHandle<String>,
}

impl Victim {
    /// Starts the worker with `env` set (killed if dropped).
    ///
    /// # Panics
    /// If the process cannot be started.
    pub fn spawn(test: &str, env: &[(&str, &str)]) -> Victim {
        let exe = std::env::current_exe().expect("the test binary");
        let mut child = Command::new(exe)
            .args([
                "--exact",
                &test_path(test),
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn the victim");
        let stdin = child.stdin.take();
        let lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        let mut stderr_pipe = child.stderr.take().expect("piped stderr");
        // Drained from the start, so a chatty worker never blocks on a full pipe.
        let stderr = tokio::spawn(async move {
            let mut all = String::new();
            let _ = stderr_pipe.read_to_string(&mut all).await;
            all
        });
        Victim {
            child,
            stdin,
            lines,
            seen: Vec::new(),
            stderr,
        }
    }

    /// What the worker [`say`]s after `marker` (trimmed; the test harness may have printed
    /// "test NAME ... " before it on the line): from a line already read, or the next one that
    /// has it. Bounded: panics, with the worker's output, if it ends or takes longer
    /// than its set-up may (120 s) before saying it.
    pub async fn said(&mut self, marker: &str) -> String {
        let after = |line: &str| {
            line.find(marker)
                .map(|at| line[at + marker.len()..].trim().to_owned())
        };
        if let Some(v) = self.seen.iter().find_map(|l| after(l)) {
            return v;
        }
        loop {
            let line = match tokio::time::timeout(SET_UP, self.lines.next_line()).await {
                Ok(Ok(Some(line))) => line,
                other => {
                    let _ = self.child.start_kill();
                    let status = self.child.wait().await;
                    let stderr = (&mut self.stderr).await.unwrap_or_default();
                    panic!(
                        "the victim never said {marker:?} ({other:?}, {status:?}):\n{}\n{stderr}",
                        self.seen.join("\n")
                    );
                }
            };
            let found = after(&line);
            self.seen.push(line);
            if let Some(v) = found {
                return v;
            }
        }
    }

    /// Writes `line` to its stdin (a worker reads it with [`heard`]); taken in even while the
    /// worker is paused, and read when it resumes.
    ///
    /// # Panics
    /// If its stdin is closed.
    pub async fn tell(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("the victim's stdin");
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .expect("write to the victim");
        stdin.flush().await.expect("flush the victim's stdin");
    }

    /// Sends it `signal` (`STOP` pauses it, as a VM pause would; `CONT` resumes it).
    ///
    /// # Panics
    /// If the signal cannot be sent.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.id().expect("the victim runs");
        let sent = std::process::Command::new("kill")
            .args([format!("-{signal}"), pid.to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -{signal} {pid}");
    }

    /// Kills it with SIGKILL (no unwinding, no destructors, nothing it could still record) and
    /// reaps it.
    ///
    /// # Panics
    /// If it cannot be killed.
    pub async fn kill(mut self) {
        self.child.kill().await.expect("kill -9 the victim");
        self.stderr.abort();
    }
}

/// In a victim: waits for a line from the parent ([`Victim::tell`]) and returns it, trimmed.
///
/// # Panics
/// If stdin is closed first.
pub async fn heard() -> String {
    let mut line = String::new();
    BufReader::new(tokio::io::stdin())
        .read_line(&mut line)
        .await
        .expect("a line from the parent");
    line.trim().to_owned()
}

/// What a replica's `charge_card` call answers: the reference it ran under.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Receipt {
    /// The call's reference.
    pub reference: String,
}

/// In a worker: one replica's share of the load. Once the parent lets the workers go, makes
/// `calls` identical `charge_card` calls at once through `engine` (same caller, same arguments,
/// a 15-minute window), each running `side_effect()` as its handler, then reports the tally;
/// `in_flight` says whether an error is the in-progress answer.
pub async fn replica_calls<E, F, Fut>(
    engine: &idempotency::Idempotency,
    replica: usize,
    calls: usize,
    side_effect: F,
    in_flight: impl Fn(&E) -> bool,
) where
    E: From<idempotency::Error> + std::fmt::Display + Send + 'static,
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Receipt, E>> + Send + 'static,
{
    use idempotency::{outcome::ErrorPolicy, tool::Prepared, Caller};
    let caller = Caller::new("acme", "alice");
    let args = serde_json::json!({"amount": 4200, "currency": "EUR", "card": "tok_visa"});

    ready_then_wait().await;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..calls {
        let (engine, caller, args, body) =
            (engine.clone(), caller.clone(), args.clone(), side_effect());
        tasks.spawn(async move {
            let prepared = Prepared::call(&caller, &crate::CHARGE_CARD, &args).expect("key");
            engine
                .execute(prepared, ErrorPolicy::retryable(), body)
                .await
        });
    }
    let mut tally = Tally::default();
    while let Some(done) = tasks.join_next().await {
        let out = done.expect("call task");
        tally.count(replica, &out, &in_flight);
    }
    tally.report(replica);
}
