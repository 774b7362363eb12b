//! Steady traffic beside a failure: what every Redis outage test measures
//! its answers and latencies by.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use super::request;

/// (sent at, latency, status) of every request the load made.
pub type Samples = Arc<Mutex<Vec<(Instant, Duration, u16)>>>;

/// Steady concurrent traffic that never hits a limit, recorded.
pub struct Load {
    stop: Arc<AtomicBool>,
    samples: Samples,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Load {
    pub fn start(addr: SocketAddr, threads: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let samples: Samples = Arc::new(Mutex::new(Vec::new()));
        // Bounded: a test that fails midway still stops its load.
        let deadline = Instant::now() + Duration::from_secs(90);
        let threads = (0..threads)
            .map(|i| {
                let (stop, samples) = (stop.clone(), samples.clone());
                thread::spawn(move || {
                    let id = format!("load-{i}");
                    while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                        let sent = Instant::now();
                        let r = request(addr, "GET", "/", &[("X-Load", &id)], b"");
                        if let Ok(mut s) = samples.lock() {
                            s.push((sent, sent.elapsed(), r.status));
                        }
                        thread::sleep(Duration::from_millis(2));
                    }
                })
            })
            .collect();
        Load {
            stop,
            samples,
            threads,
        }
    }

    /// Requests answered that were sent at `from` or later.
    pub fn answered_since(&self, from: Instant) -> usize {
        self.samples
            .lock()
            .map(|s| s.iter().filter(|(sent, _, _)| *sent >= from).count())
            .unwrap_or(0)
    }

    pub fn finish(self) -> Vec<(Instant, Duration, u16)> {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            let _ = t.join();
        }
        self.samples.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// Many clients' requests at once, each of which must be admitted: what a
/// change made under traffic is measured by (none may fail).
pub struct ClientLoad {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicUsize>,
    failed: Arc<AtomicUsize>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl ClientLoad {
    /// `connections` threads in turn over `addrs`, each sending `header`
    /// with one of `values` (in turn) until stopped, or for 60 s at most.
    pub fn start(
        addrs: &[SocketAddr],
        connections: usize,
        header: &'static str,
        values: &[String],
    ) -> ClientLoad {
        let stop = Arc::new(AtomicBool::new(false));
        let (sent, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let deadline = Instant::now() + Duration::from_secs(60);
        let threads = (0..connections)
            .map(|i| {
                let (stop, sent, failed) = (stop.clone(), sent.clone(), failed.clone());
                let addr = addrs[i % addrs.len()];
                let value = values[i % values.len()].clone();
                thread::spawn(move || {
                    while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                        let r = request(addr, "GET", "/", &[(header, &value)], b"");
                        sent.fetch_add(1, Ordering::SeqCst);
                        if r.status != 200 {
                            failed.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                })
            })
            .collect();
        ClientLoad {
            stop,
            sent,
            failed,
            threads,
        }
    }

    /// Requests sent so far.
    pub fn sent(&self) -> usize {
        self.sent.load(Ordering::SeqCst)
    }

    /// Stops the clients: (requests sent, requests not answered 200).
    pub fn finish(self) -> (usize, usize) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            t.join().expect("a load thread panicked");
        }
        (
            self.sent.load(Ordering::SeqCst),
            self.failed.load(Ordering::SeqCst),
        )
    }
}
