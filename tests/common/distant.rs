//! A TCP link that delays every byte by a fixed time each way, between
//! clients on loopback and a server on loopback: the server as a client
//! sees one across a network.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

pub struct DistantLink {
    pub port: u16,
    stop: Arc<AtomicBool>,
    /// Every stream the link holds, shut down when it is dropped.
    streams: Arc<Mutex<Vec<TcpStream>>>,
}

impl DistantLink {
    /// Listens on `port` and carries each connection to the server on
    /// `to`, `one_way` later in each direction.
    pub fn start(port: u16, to: u16, one_way: Duration) -> DistantLink {
        let listener = TcpListener::bind(("127.0.0.1", port)).expect("link port");
        let stop = Arc::new(AtomicBool::new(false));
        let streams: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (stopped, held) = (stop.clone(), streams.clone());
        thread::spawn(move || {
            for client in listener.incoming() {
                if stopped.load(Ordering::Acquire) {
                    return;
                }
                let (Ok(client), Ok(server)) = (client, TcpStream::connect(("127.0.0.1", to)))
                else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let clones = [&client, &server].map(|s| s.try_clone());
                if let [Ok(c), Ok(s)] = clones {
                    if let Ok(mut held) = held.lock() {
                        held.extend([c, s]);
                    }
                }
                carry(&client, &server, one_way);
                carry(&server, &client, one_way);
            }
        });
        DistantLink {
            port,
            stop,
            streams,
        }
    }
}

/// Bytes read from `from` are written to `to` `delay` after they arrived.
fn carry(from: &TcpStream, to: &TcpStream, delay: Duration) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
        return;
    };
    let (send, due) = mpsc::channel::<(Instant, Vec<u8>)>();
    thread::spawn(move || {
        let mut buffer = [0u8; 16 * 1024];
        while let Ok(n) = from.read(&mut buffer) {
            if n == 0
                || send
                    .send((Instant::now() + delay, buffer[..n].to_vec()))
                    .is_err()
            {
                break;
            }
        }
    });
    thread::spawn(move || {
        for (at, bytes) in due {
            // The delay is the link's length, not a wait for an event.
            thread::sleep(at.saturating_duration_since(Instant::now()));
            if to.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

impl Drop for DistantLink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wakes the accept loop to see `stop`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Ok(streams) = self.streams.lock() {
            for stream in streams.iter() {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
    }
}
