//! Real redis-server processes on free ports, for the Redis tests.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{free_port, make_certificates, temp_dir, wait_until};

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

    pub fn start_with(extra: &[&str]) -> RedisServer {
        let mut server = RedisServer {
            port: free_port(),
            dir: temp_dir(),
            child: None,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            password: None,
            tls_ca: None,
        };
        server.spawn();
        server
    }

    /// A server that wants a password.
    pub fn start_with_password(password: &str) -> RedisServer {
        let mut server = RedisServer {
            port: free_port(),
            dir: temp_dir(),
            child: None,
            extra: vec!["--requirepass".into(), password.into()],
            password: Some(password.into()),
            tls_ca: None,
        };
        server.spawn();
        server
    }

    /// A server that speaks TLS only, with a certificate from a fresh CA made
    /// by `openssl`.
    pub fn start_tls() -> RedisServer {
        let dir = temp_dir();
        make_certificates(&dir);
        let port = free_port();
        let path = |f: &str| dir.join(f).to_string_lossy().into_owned();
        let mut server = RedisServer {
            port,
            dir: dir.clone(),
            child: None,
            extra: vec![
                "--port".into(),
                "0".into(),
                "--tls-port".into(),
                port.to_string(),
                "--tls-cert-file".into(),
                path("server.crt"),
                "--tls-key-file".into(),
                path("server.key"),
                "--tls-ca-cert-file".into(),
                path("ca.crt"),
                "--tls-auth-clients".into(),
                "no".into(),
            ],
            password: None,
            tls_ca: Some(dir.join("ca.crt")),
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
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
        assert!(
            wait_until(Duration::from_secs(10), || self
                .client()
                .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)))
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                .is_ok()),
            "redis-server on {} did not answer",
            self.port
        );
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
        let mut c = redis::cmd(args[0]);
        for a in &args[1..] {
            c.arg(*a);
        }
        c.query(&mut self.connection()).expect("redis command")
    }

    /// Calls of one command since the last `CONFIG RESETSTAT`.
    pub fn calls(&self, command: &str) -> u64 {
        let stats: String = self.cmd(&["INFO", "commandstats"]);
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
            .and_then(|v| v.split(',').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    pub fn keys(&self) -> Vec<String> {
        self.cmd(&["KEYS", "*"])
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
        let nodes: Vec<RedisServer> = (0..3)
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
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli");
        assert!(status.success(), "redis-cli --cluster create failed");
        let cluster = RedisCluster { nodes };
        assert!(
            wait_until(Duration::from_secs(20), || cluster.nodes.iter().all(|n| {
                let info: String = n.cmd(&["CLUSTER", "INFO"]);
                info.contains("cluster_state:ok")
            })),
            "cluster did not become ready"
        );
        cluster
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

/// Is something listening (used to tell a killed server from a live one).
pub fn listening(port: u16) -> bool {
    TcpStream::connect(("127.0.0.1", port)).is_ok()
}
