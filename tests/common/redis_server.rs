//! Real redis-server processes on free ports, for the Redis tests.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{free_port, make_certificates, temp_dir, wait_until};

/// A free port whose cluster bus port (its own plus 10,000) is free too.
fn cluster_port() -> u16 {
    loop {
        let port = free_port();
        if port <= 55_535 && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

pub struct RedisServer {
    pub port: u16,
    pub dir: PathBuf,
    child: Option<Child>,
    extra: Vec<String>,
    password: Option<String>,
    /// The CA that signed the server's certificate, when it speaks TLS only.
    pub tls_ca: Option<PathBuf>,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// A server with more arguments. Its port was free a moment ago, and
    /// another test may take it meanwhile: a server that cannot bind it
    /// exits, and is started again on another (a cluster node also needs
    /// its bus port, its own plus 10,000, free).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        let cluster = extra.contains(&"--cluster-enabled");
        let mut tries = 0;
        loop {
            let mut server = RedisServer {
                port: if cluster { cluster_port() } else { free_port() },
                dir: temp_dir(),
                child: None,
                extra: extra.iter().map(|s| s.to_string()).collect(),
                password: None,
                tls_ca: None,
            };
            tries += 1;
            if server.try_spawn() || tries == 3 {
                assert!(
                    server.answers(),
                    "redis-server on {} did not answer",
                    server.port
                );
                return server;
            }
        }
    }

    /// A server that wants a password.
    pub fn start_with_password(password: &str) -> RedisServer {
        RedisServer::start_with_password_and(password, &[])
    }

    /// A server that wants a password, with more arguments.
    pub fn start_with_password_and(password: &str, extra: &[&str]) -> RedisServer {
        let mut extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        extra.extend(["--requirepass".into(), password.into()]);
        let mut server = RedisServer {
            port: free_port(),
            dir: temp_dir(),
            child: None,
            extra,
            password: Some(password.into()),
            tls_ca: None,
        };
        server.spawn();
        server
    }

    /// What `ROLE` says first: "master" or "slave"; empty while the server
    /// drops its clients (it does at a change of role).
    pub fn role(&self) -> String {
        let role: Vec<redis::Value> = self
            .client()
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)))
            .and_then(|mut c| redis::cmd("ROLE").query(&mut c))
            .unwrap_or_default();
        match role.first() {
            Some(redis::Value::BulkString(name)) => String::from_utf8_lossy(name).into_owned(),
            _ => String::new(),
        }
    }

    /// A server that speaks TLS only, with a certificate from a fresh CA made
    /// by `openssl`.
    pub fn start_tls() -> RedisServer {
        let dir = temp_dir();
        make_certificates(&dir);
        let mut server = RedisServer::start_tls_with(&dir, None, &[]);
        // The certificates go with the server.
        let unused = std::mem::replace(&mut server.dir, dir);
        super::remove_test_dir(&unused);
        server
    }

    /// A server that speaks TLS only (to its clients and, as a replica, to
    /// its master), with the certificates `make_certificates` made in
    /// `certificates`.
    pub fn start_tls_with(
        certificates: &Path,
        password: Option<&str>,
        extra: &[&str],
    ) -> RedisServer {
        let port = free_port();
        let mut args = vec![
            "--port".to_string(),
            "0".into(),
            "--tls-port".into(),
            port.to_string(),
        ];
        args.extend(
            tls_arguments(certificates)
                .into_iter()
                .flat_map(|(k, v)| [format!("--{k}"), v]),
        );
        if let Some(password) = password {
            args.extend(["--requirepass".into(), password.into()]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut server = RedisServer {
            port,
            dir: temp_dir(),
            child: None,
            extra: args,
            password: password.map(String::from),
            tls_ca: Some(certificates.join("ca.crt")),
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        assert!(
            self.try_spawn(),
            "redis-server on {} did not answer",
            self.port
        );
    }

    fn answers(&self) -> bool {
        self.client()
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)))
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
            .is_ok()
    }

    /// Starts the process; whether it answers within 10 s (not if it
    /// exited: its port was taken).
    fn try_spawn(&mut self) -> bool {
        let port_args = if self.tls_ca.is_some() {
            Vec::new()
        } else {
            vec!["--port".to_string(), self.port.to_string()]
        };
        let child = Command::new("redis-server")
            .args(&port_args)
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--dir", self.dir.to_str().unwrap_or(".")])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (scripts/test.sh installs it)");
        self.child = Some(child);
        let mut exited = false;
        let answered = wait_until(Duration::from_secs(10), || {
            exited = self
                .child
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
            exited || self.answers()
        });
        answered && !exited
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls_ca.is_some() {
            "rediss"
        } else {
            "redis"
        };
        match &self.password {
            Some(p) => format!("{scheme}://:{p}@127.0.0.1:{}/0", self.port),
            None => format!("{scheme}://127.0.0.1:{}/0", self.port),
        }
    }

    fn client(&self) -> redis::RedisResult<redis::Client> {
        match &self.tls_ca {
            Some(ca) => redis::Client::build_with_tls(
                self.url(),
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(std::fs::read(ca).unwrap_or_default()),
                },
            ),
            None => redis::Client::open(self.url()),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }

    pub fn connection(&self) -> redis::Connection {
        self.client()
            .and_then(|c| c.get_connection())
            .expect("connect to redis")
    }

    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        self.try_cmd(args).expect("redis command")
    }

    /// `cmd`, for a server that may be between roles (a failover drops its
    /// clients): an error is `None`, for a poll to try again.
    pub fn try_cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> Option<T> {
        let mut c = redis::cmd(args[0]);
        for a in &args[1..] {
            c.arg(*a);
        }
        let mut connection = self
            .client()
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)))
            .ok()?;
        c.query(&mut connection).ok()
    }

    /// Calls of one command since the last `CONFIG RESETSTAT` (0 while the
    /// server cannot answer).
    pub fn calls(&self, command: &str) -> u64 {
        let stats: String = self.try_cmd(&["INFO", "commandstats"]).unwrap_or_default();
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
            .and_then(|v| v.split(',').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    /// Every key (none while the server cannot answer).
    pub fn keys(&self) -> Vec<String> {
        self.try_cmd(&["KEYS", "*"]).unwrap_or_default()
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts again on the same port (empty: no persistence).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

/// The settings (name, value) that make a server or a sentinel speak TLS
/// only, to clients and to the servers it connects to, with the
/// certificates in `certificates`.
fn tls_arguments(certificates: &Path) -> Vec<(&'static str, String)> {
    let path = |f: &str| certificates.join(f).to_string_lossy().into_owned();
    vec![
        ("tls-cert-file", path("server.crt")),
        ("tls-key-file", path("server.key")),
        ("tls-ca-cert-file", path("ca.crt")),
        ("tls-auth-clients", "no".into()),
        ("tls-replication", "yes".into()),
    ]
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        super::remove_test_dir(&self.dir);
    }
}

/// A 3-master Redis Cluster on loopback, made with `redis-cli --cluster create`.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        RedisCluster::start_with_replicas(0)
    }

    /// Three masters, each with `replicas` replicas (`nodes[0..3]` the
    /// masters as `redis-cli` assigns them, then their replicas).
    pub fn start_with_replicas(replicas: usize) -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..3 * (1 + replicas))
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ])
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let status = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli");
        assert!(status.success(), "redis-cli --cluster create failed");
        let cluster = RedisCluster { nodes };
        assert!(
            wait_until(Duration::from_secs(30), || cluster.nodes.iter().all(|n| {
                // A replica syncing with its master may drop a client.
                let (Some(info), Some(replication)) = (
                    n.try_cmd::<String>(&["CLUSTER", "INFO"]),
                    n.try_cmd::<String>(&["INFO", "replication"]),
                ) else {
                    return false;
                };
                info.contains("cluster_state:ok")
                    && (replicas == 0
                        || replication.contains("master_link_status:up")
                        || replication.contains("state=online"))
            })),
            "cluster did not become ready"
        );
        cluster
    }

    /// Whether the cluster, as the live node `at` sees it, serves every slot.
    pub fn serves_all_slots(&self, at: usize) -> bool {
        let info: Option<String> = self.nodes[at]
            .client()
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)))
            .and_then(|mut c| redis::cmd("CLUSTER").arg("INFO").query(&mut c))
            .ok();
        info.is_some_and(|i| i.contains("cluster_state:ok"))
    }

    /// The node id of `nodes[i]`.
    pub fn node_id(&self, i: usize) -> String {
        self.nodes[i].cmd(&["CLUSTER", "MYID"])
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| n.url().replace("/0", ""))
            .collect()
    }

    /// Keys held by each node.
    pub fn keys_per_node(&self) -> Vec<Vec<String>> {
        self.nodes.iter().map(|n| n.keys()).collect()
    }
}

/// A master with a password, its replica, and three sentinels watching
/// them (quorum 2), on loopback: what `[redis].sentinel` follows.
pub struct SentinelGroup {
    /// `nodes[0]` is the first master, `nodes[1]` its replica; a failover
    /// swaps their roles.
    pub nodes: Vec<RedisServer>,
    pub sentinels: Vec<Sentinel>,
}

/// The name the sentinels monitor the master by.
pub const SENTINEL_MASTER: &str = "fgmaster";

/// The master's (and the replica's) password.
pub const SENTINEL_PASSWORD: &str = "sentinel-group-password";

/// The sentinels' own password, in a group started with
/// [`SentinelGroup::start_guarded`]: not the master's.
pub const SENTINELS_OWN_PASSWORD: &str = "the-sentinels-own-word";

impl SentinelGroup {
    pub fn start() -> SentinelGroup {
        SentinelGroup::start_with(None, None)
    }

    /// A group whose sentinels answer only clients that give
    /// [`SENTINELS_OWN_PASSWORD`] (their `requirepass`; they give it to each
    /// other too).
    pub fn start_guarded() -> SentinelGroup {
        SentinelGroup::start_with(Some(SENTINELS_OWN_PASSWORD), None)
    }

    /// A group that speaks TLS only: the nodes to their clients and to each
    /// other, the sentinels to their clients, the nodes and each other. The
    /// CA that signed every certificate is `certificates/ca.crt`.
    pub fn start_tls(certificates: &Path) -> SentinelGroup {
        SentinelGroup::start_with(None, Some(certificates))
    }

    fn start_with(sentinel_password: Option<&str>, tls: Option<&Path>) -> SentinelGroup {
        let pw = SENTINEL_PASSWORD;
        let node = |extra: &[&str]| {
            let mut args = vec!["--masterauth", pw];
            args.extend(extra);
            match tls {
                Some(certificates) => RedisServer::start_tls_with(certificates, Some(pw), &args),
                None => RedisServer::start_with_password_and(pw, &args),
            }
        };
        let master = node(&[]);
        let master_port = master.port.to_string();
        let replica = node(&["--replicaof", "127.0.0.1", &master_port]);
        let sentinels = (0..3)
            .map(|_| Sentinel::start(master.port, sentinel_password, tls))
            .collect();
        let group = SentinelGroup {
            nodes: vec![master, replica],
            sentinels,
        };
        group.await_settled(0, 1);
        group
    }

    /// Waits until `nodes[replica]` replicates `nodes[master]` and every
    /// sentinel names that master and knows the replica and the other two
    /// sentinels: only then can a failover happen.
    pub fn await_settled(&self, master: usize, replica: usize) {
        let (m, r) = (&self.nodes[master], &self.nodes[replica]);
        let settled = wait_until(Duration::from_secs(40), || {
            // A node the sentinels are turning into a replica drops its
            // clients: that poll saw nothing yet.
            let Some(info) = r.try_cmd::<String>(&["INFO", "replication"]) else {
                return false;
            };
            info.contains("master_link_status:up")
                && info.contains(&format!("master_port:{}", m.port))
                && self.sentinels.iter().all(|s| {
                    s.master_port() == Some(m.port)
                        && s.knows_replica(r.port)
                        && s.other_sentinels() == 2
                })
        });
        assert!(settled, "the sentinel group did not settle");
    }

    /// The `host:port` of every sentinel, for `[redis].sentinel.nodes`.
    pub fn sentinel_nodes(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect()
    }
}

/// One `redis-sentinel` process.
pub struct Sentinel {
    pub port: u16,
    password: Option<String>,
    /// The CA to trust, when the sentinel speaks TLS only.
    tls_ca: Option<PathBuf>,
    dir: PathBuf,
    child: Option<Child>,
}

impl Sentinel {
    fn start(master_port: u16, password: Option<&str>, tls: Option<&Path>) -> Sentinel {
        let port = free_port();
        let dir = temp_dir();
        // A sentinel rewrites its config file: it must be its own, writable.
        let config = dir.join("sentinel.conf");
        let listen = match tls {
            Some(certificates) => {
                let mut lines = format!("port 0\ntls-port {port}\n");
                for (name, value) in tls_arguments(certificates) {
                    lines.push_str(&format!("{name} {value}\n"));
                }
                lines
            }
            None => format!("port {port}\n"),
        };
        let mut text = format!(
            "{listen}bind 127.0.0.1\ndir {dir}\n\
             sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {master_port} 2\n\
             sentinel auth-pass {SENTINEL_MASTER} {SENTINEL_PASSWORD}\n\
             sentinel down-after-milliseconds {SENTINEL_MASTER} 1000\n\
             sentinel failover-timeout {SENTINEL_MASTER} 10000\n\
             sentinel parallel-syncs {SENTINEL_MASTER} 1\n",
            dir = dir.display()
        );
        if let Some(password) = password {
            text.push_str(&format!(
                "requirepass {password}\nsentinel sentinel-pass {password}\n"
            ));
        }
        std::fs::write(&config, text).expect("sentinel config");
        // The system's redis-sentinel when installed; redis-server in
        // sentinel mode is the same program.
        let mut command = if Command::new("redis-sentinel")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
        {
            let mut c = Command::new("redis-sentinel");
            c.arg(&config);
            c
        } else {
            let mut c = Command::new("redis-server");
            c.arg(&config).arg("--sentinel");
            c
        };
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-sentinel must be installed (scripts/test.sh installs it)");
        let sentinel = Sentinel {
            port,
            password: password.map(String::from),
            tls_ca: tls.map(|certificates| certificates.join("ca.crt")),
            dir,
            child: Some(child),
        };
        assert!(
            wait_until(Duration::from_secs(10), || sentinel
                .query::<String>(&["PING"])
                .is_some()),
            "redis-sentinel on {port} did not answer"
        );
        sentinel
    }

    pub fn query<T: redis::FromRedisValue>(&self, args: &[&str]) -> Option<T> {
        self.query_as(self.password.as_deref(), args)
    }

    /// As [`Sentinel::query`], without the sentinels' password.
    pub fn query_without_password<T: redis::FromRedisValue>(&self, args: &[&str]) -> Option<T> {
        self.query_as(None, args)
    }

    fn query_as<T: redis::FromRedisValue>(
        &self,
        password: Option<&str>,
        args: &[&str],
    ) -> Option<T> {
        let auth = password.map_or(String::new(), |p| format!(":{p}@"));
        let client = match &self.tls_ca {
            Some(ca) => redis::Client::build_with_tls(
                format!("rediss://{auth}127.0.0.1:{}", self.port),
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(std::fs::read(ca).ok()?),
                },
            ),
            None => redis::Client::open(format!("redis://{auth}127.0.0.1:{}", self.port)),
        }
        .ok()?;
        let mut connection = client
            .get_connection_with_timeout(Duration::from_millis(500))
            .ok()?;
        let mut c = redis::cmd(args[0]);
        for a in &args[1..] {
            c.arg(*a);
        }
        c.query(&mut connection).ok()
    }

    /// The master's port as this sentinel names it.
    pub fn master_port(&self) -> Option<u16> {
        self.query::<Option<(String, u16)>>(&[
            "SENTINEL",
            "GET-MASTER-ADDR-BY-NAME",
            SENTINEL_MASTER,
        ])
        .flatten()
        .map(|(_, port)| port)
    }

    fn knows_replica(&self, port: u16) -> bool {
        self.query::<Vec<Vec<String>>>(&["SENTINEL", "REPLICAS", SENTINEL_MASTER])
            .unwrap_or_default()
            .iter()
            .any(|fields| {
                let field = |name: &str| {
                    fields
                        .iter()
                        .position(|f| f == name)
                        .and_then(|i| fields.get(i + 1))
                        .cloned()
                        .unwrap_or_default()
                };
                field("port") == port.to_string()
                    && field("flags") == "slave"
                    && field("master-link-status") == "ok"
            })
    }

    fn other_sentinels(&self) -> usize {
        self.query::<Vec<redis::Value>>(&["SENTINEL", "SENTINELS", SENTINEL_MASTER])
            .map_or(0, |s| s.len())
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        super::remove_test_dir(&self.dir);
    }
}

/// Is something listening (used to tell a killed server from a live one).
pub fn listening(port: u16) -> bool {
    TcpStream::connect(("127.0.0.1", port)).is_ok()
}
