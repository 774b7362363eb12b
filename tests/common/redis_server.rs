//! Real redis-server processes on free ports, for the Redis tests.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{free_port, temp_dir, wait_until};

pub struct RedisServer {
    pub port: u16,
    pub dir: PathBuf,
    child: Option<Child>,
    extra: Vec<String>,
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
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--dir", self.dir.to_str().unwrap_or(".")])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (scripts/test.sh installs it)");
        self.child = Some(child);
        let url = self.url();
        assert!(
            wait_until(Duration::from_secs(10), || ping(&url)),
            "redis-server on {} did not answer",
            self.port
        );
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }

    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
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
    }
}

pub fn ping(url: &str) -> bool {
    redis::Client::open(url)
        .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
        .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
        .is_ok()
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
