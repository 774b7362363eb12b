//! Every HTTP/2 request is tied to its own stream, whatever its client puts
//! in its header block: a block that ends inside a field cannot swallow the
//! name the connection's watch gives the stream, and so cannot hide its
//! request from the caps and deadlines that hang on the stream. The attack
//! is below any client library: raw frames over a plain socket.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::{wait_until, ConfigBuilder, Upstream};

const HEADERS: u8 = 0x1;
const PRIORITY: u8 = 0x2;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

fn frame(kind: u8, flags: u8, id: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    f.push(kind);
    f.push(flags);
    f.extend_from_slice(&id.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A literal field without indexing, with a new name (RFC 7541 §6.2.2).
fn literal(name: &str, value: &str) -> Vec<u8> {
    let mut field = vec![0x00, name.len() as u8];
    field.extend(name.as_bytes());
    field.push(value.len() as u8);
    field.extend(value.as_bytes());
    field
}

/// A GET for `path` whose block forges the stream's name, then ends with a
/// literal whose Huffman value declares `swallow` bytes and sends none: a
/// reader that appends a field after the block gives it those bytes.
fn hiding_block(path: &str, swallow: usize) -> Vec<u8> {
    let mut block = vec![0x82, 0x86, 0x04, path.len() as u8];
    block.extend(path.as_bytes());
    block.extend([0x01, 4]);
    block.extend(b"test");
    block.extend(literal("floodgate-h2-stream", "1234abcd:1"));
    block.extend([0x00, 0x01, b'x', 0x80 | swallow as u8]);
    block
}

/// The watch's naming field for stream `id`: 2 + 19 + 1 bytes of literal
/// around `<64-bit id in hex>:<stream>` (16 hex digits but for 1 in 16
/// watches).
fn naming_field_len(id: u32) -> usize {
    22 + 16 + 1 + id.to_string().len()
}

/// Reads frames until the server says GOAWAY (true) or the connection goes
/// quiet or closes (false).
fn told_to_go_away(socket: &mut TcpStream) -> bool {
    socket
        .set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let since = Instant::now();
    while since.elapsed() < Duration::from_secs(10) {
        match socket.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        let mut at = 0;
        while buf.len() >= at + 9 {
            let len = u32::from_be_bytes([0, buf[at], buf[at + 1], buf[at + 2]]) as usize;
            if buf[at + 3] == GOAWAY {
                return true;
            }
            at += 9 + len;
        }
    }
    false
}

/// 60 connections from one address at once, each opening a stream whose
/// block ends inside a field and having the h2 server reset it at once (a
/// PRIORITY on itself): none of the requests reaches the upstream, every
/// connection is told to go away, and the gateway serves as before. On the
/// build before, the watch's name became the unfinished value whenever it
/// read as valid Huffman (about 1 watch in 4), the forged name was read,
/// and the request went on tied to no stream: 12 of 60 reached the
/// upstream, past every cap that hangs on a stream.
#[test]
fn a_block_that_ends_inside_a_field_hides_no_request() {
    const ATTACKERS: usize = 60;
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .server("h2c = true\nmax_connections_per_ip = 64")
        .read_timeout("60s")
        .start();
    let attack = |addr: SocketAddr, n: usize| -> bool {
        let mut socket = TcpStream::connect(addr).expect("connect");
        let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        out.extend(frame(SETTINGS, 0, 0, b""));
        let block = hiding_block(&format!("/hold/{n}"), naming_field_len(1));
        out.extend(frame(HEADERS, END_HEADERS | END_STREAM, 1, &block));
        out.extend(frame(PRIORITY, 0, 1, &[0, 0, 0, 1, 16]));
        // The server may close before all is written.
        let _ = socket.write_all(&out);
        told_to_go_away(&mut socket)
    };
    let addr = proxy.addr;
    let threads: Vec<_> = (0..ATTACKERS)
        .map(|n| std::thread::spawn(move || attack(addr, n)))
        .collect();
    let went_away = threads
        .into_iter()
        .map(|t| t.join().unwrap_or(false))
        .filter(|&gone| gone)
        .count();
    let heads = upstream.heads();
    upstream.release();
    assert_eq!(
        heads, 0,
        "requests hidden from their stream reached the upstream"
    );
    assert_eq!(went_away, ATTACKERS, "connections told to go away");
    assert!(wait_until(Duration::from_secs(5), || proxy.get("/").status == 200));
}
