use std::sync::Arc;
use std::task::Waker;
use std::time::Duration;

use pingora::protocols::SocketDigest;
use tokio::time::Instant;

use super::client::ClientFrames;
use super::h2_stream::H2Stream;
use super::naming::{naming_frame, stream_header, STREAM_HEADER};
use super::server::ServerFrames;
use super::watch::{H2Watch, MOST_STREAMS};
use super::wire::{
    self_dependency, CONTINUATION, DATA, END_HEADERS, END_STREAM, HEADERS, PADDED, PRIORITY,
    PRIORITY_FLAG, RST_STREAM,
};

const CANCEL: u32 = 0x8;

fn frame(kind: u8, flags: u8, id: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    f.push(kind);
    f.push(flags);
    f.extend_from_slice(&id.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

fn named(watch: u64, id: u32) -> Vec<u8> {
    let mut frame = Vec::new();
    naming_frame(watch, id, &mut frame);
    frame
}

fn preface() -> Vec<u8> {
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec()
}

/// Everything read, fed byte by byte: frames cut anywhere read alike.
fn read_all(frames: &mut ClientFrames, input: &[u8], by_byte: bool) -> Vec<u8> {
    let mut out = Vec::new();
    if by_byte {
        for b in input {
            frames.read(std::slice::from_ref(b), &mut out);
        }
    } else {
        frames.read(input, &mut out);
    }
    out
}

#[test]
fn a_reset_of_a_whole_request_waits_for_its_answer() {
    for by_byte in [false, true] {
        let watch = H2Watch::new(None, Duration::from_secs(10), Duration::from_secs(60));
        let mut client = ClientFrames::new(watch.clone());
        let mut server = ServerFrames::new(watch.clone());
        let mut input = preface();
        input.extend(frame(HEADERS, END_HEADERS | END_STREAM, 1, b"\x82"));
        input.extend(frame(RST_STREAM, 0, 1, &CANCEL.to_be_bytes()));
        input.extend(frame(HEADERS, END_HEADERS, 3, b"\x83"));
        input.extend(frame(RST_STREAM, 0, 3, &CANCEL.to_be_bytes()));
        let out = read_all(&mut client, &input, by_byte);
        let mut expected = preface();
        // Stream 1's block gets the naming frame; its reset is held.
        expected.extend(frame(HEADERS, END_STREAM, 1, b"\x82"));
        expected.extend(named(watch.id, 1));
        // Stream 3's request was not whole: its reset goes on.
        expected.extend(frame(HEADERS, 0, 3, b"\x83"));
        expected.extend(named(watch.id, 3));
        expected.extend(frame(RST_STREAM, 0, 3, &CANCEL.to_be_bytes()));
        assert_eq!(out, expected, "by byte: {by_byte}");
        let waker = Waker::noop();
        let mut buf = [0u8; 64];
        assert_eq!(watch.pending_inbound(&mut buf, waker), 0);
        // The answer's head goes out: the reset follows it in.
        server.wrote(&frame(HEADERS, END_HEADERS, 1, b"\x88")[..5]);
        assert_eq!(watch.pending_inbound(&mut buf, waker), 0);
        server.wrote(&frame(HEADERS, END_HEADERS, 1, b"\x88")[5..]);
        let n = watch.pending_inbound(&mut buf, waker);
        assert_eq!(
            &buf[..n],
            &frame(RST_STREAM, 0, 1, &CANCEL.to_be_bytes())[..]
        );
        assert!(watch.shared().streams.is_empty());
    }
}

#[test]
fn the_stream_is_named_once_after_its_whole_first_block() {
    let watch = H2Watch::new(None, Duration::from_secs(10), Duration::from_secs(60));
    let mut client = ClientFrames::new(watch.clone());
    let mut input = preface();
    input.extend(frame(HEADERS, 0, 5, b"\x82"));
    input.extend(frame(CONTINUATION, END_HEADERS, 5, b"\x84"));
    input.extend(frame(DATA, 0, 5, b"abc"));
    // Trailers: no name.
    input.extend(frame(HEADERS, END_HEADERS | END_STREAM, 5, b"\x40"));
    let out = read_all(&mut client, &input, true);
    let mut expected = preface();
    expected.extend(frame(HEADERS, 0, 5, b"\x82"));
    expected.extend(frame(CONTINUATION, 0, 5, b"\x84"));
    expected.extend(named(watch.id, 5));
    expected.extend(frame(DATA, 0, 5, b"abc"));
    expected.extend(frame(HEADERS, END_HEADERS | END_STREAM, 5, b"\x40"));
    assert_eq!(out, expected);
    let (whole, body_bytes) = {
        let shared = watch.shared();
        (shared.streams[&5].whole, shared.streams[&5].body_bytes)
    };
    assert!(whole);
    assert_eq!(body_bytes, 3);
    let mut headers = http::HeaderMap::new();
    headers.append(STREAM_HEADER, "forged:7".parse().unwrap());
    headers.append(STREAM_HEADER, format!("{:x}:5", watch.id).parse().unwrap());
    let named_stream =
        H2Stream::named(stream_header(&headers).expect("a value"), None).expect("named");
    assert_eq!(named_stream.id, 5);
    // The value the frame carries, as the gateway parses it.
    assert!(named(0x00ab_cdef, 77).ends_with(b"\x09abcdef:77"));
    assert!(named(u64::MAX, 1).ends_with(b"ffffffffffffffff:1"));
}

#[test]
fn a_late_body_is_cut_and_a_gone_client_waits_for_its_answers() {
    let watch = H2Watch::new(None, Duration::from_secs(1), Duration::from_secs(60));
    let mut client = ClientFrames::new(watch.clone());
    let mut input = preface();
    input.extend(frame(HEADERS, END_HEADERS, 1, b"\x82"));
    input.extend(frame(HEADERS, END_HEADERS, 3, b"\x82"));
    input.extend(frame(HEADERS, END_HEADERS | END_STREAM, 5, b"\x82"));
    read_all(&mut client, &input, false);
    let start = Instant::now();
    // Stream 3 holds a slot: its body is due in 100 ms.
    let slot_holder = H2Stream {
        watch: watch.clone(),
        id: 3,
    };
    slot_holder.body_deadline(start + Duration::from_millis(100));
    let next = watch.tick(start, Waker::noop());
    assert!(next.is_some_and(|n| n <= start + Duration::from_millis(100)));
    watch.tick(start + Duration::from_millis(150), Waker::noop());
    let mut buf = [0u8; 64];
    let n = watch.pending_inbound(&mut buf, Waker::noop());
    assert_eq!(&buf[..n], &self_dependency(3)[..]);
    assert_eq!(watch.take_cut(), vec![3]);
    // The client goes: stream 1's body will never come (cut); stream
    // 5's whole request keeps the reads open until it is answered.
    watch.client_left();
    let n = watch.pending_inbound(&mut buf, Waker::noop());
    assert_eq!(&buf[..n], &self_dependency(1)[..]);
    assert!(!watch.finished());
    ServerFrames::new(watch.clone()).wrote(&frame(HEADERS, END_HEADERS, 5, b"\x88"));
    assert!(watch.finished());
}

#[test]
fn a_second_reset_or_a_provoked_server_reset_still_counts_the_exchange() {
    let watch = H2Watch::new(None, Duration::from_secs(10), Duration::from_secs(60));
    let mut client = ClientFrames::new(watch.clone());
    let mut input = preface();
    input.extend(frame(HEADERS, END_HEADERS | END_STREAM, 1, b"\x82"));
    input.extend(frame(HEADERS, END_HEADERS | END_STREAM, 3, b"\x82"));
    read_all(&mut client, &input, false);
    let mut headers = http::HeaderMap::new();
    headers.insert(STREAM_HEADER, format!("{:x}:1", watch.id).parse().unwrap());
    let one = H2Stream::named(stream_header(&headers).expect("a value"), None).expect("named");
    headers.insert(STREAM_HEADER, format!("{:x}:3", watch.id).parse().unwrap());
    let three = H2Stream::named(stream_header(&headers).expect("a value"), None).expect("named");
    // Two resets of stream 1: neither reaches the h2 server.
    let reset = frame(RST_STREAM, 0, 1, &CANCEL.to_be_bytes());
    let mut twice = reset.clone();
    twice.extend(&reset);
    assert_eq!(read_all(&mut client, &twice, false), Vec::<u8>::new());
    // The h2 server resets stream 3 for an error the client provoked:
    // its exchange is cut with its request whole.
    ServerFrames::new(watch.clone()).wrote(&frame(RST_STREAM, 0, 3, &1u32.to_be_bytes()));
    assert!(three.cut_while_whole());
    assert!(one.cut_while_whole(), "still waiting for its answer");
    drop((one, three));
    let shared = watch.shared();
    assert_eq!(
        shared.streams.len(),
        1,
        "only the held reset's stream is left"
    );
}

#[test]
fn the_watchs_frames_go_in_at_the_next_frame_boundary_and_only_there() {
    let watch = H2Watch::new(None, Duration::from_secs(10), Duration::from_secs(60));
    let mut client = ClientFrames::new(watch.clone());
    let mut input = preface();
    input.extend(frame(HEADERS, END_HEADERS, 1, b"\x82"));
    let unknown = frame(0xfa, 0, 0, &[7u8; 20]);
    input.extend(&unknown[..15]);
    let mut out = read_all(&mut client, &input, false);
    assert!(!client.between_frames());
    assert!(client.inside_frame().is_some());
    // A cut comes due while a frame is half in: it waits for its end.
    watch.client_left();
    out.extend(read_all(&mut client, &unknown[15..], false));
    let mut next = frame(PRIORITY, 0, 9, &[0, 0, 0, 0, 16]);
    out.extend(read_all(&mut client, &next[..4], false));
    let mut expected = preface();
    expected.extend(frame(HEADERS, 0, 1, b"\x82"));
    expected.extend(named(watch.id, 1));
    expected.extend(&unknown);
    expected.extend(self_dependency(1));
    assert_eq!(out, expected);
    next.drain(..4);
    assert_eq!(
        read_all(&mut client, &next, false),
        frame(PRIORITY, 0, 9, &[0, 0, 0, 0, 16])
    );
}

#[test]
fn a_block_that_ends_inside_a_field_is_ended_unnamed() {
    for by_byte in [false, true] {
        let watch = H2Watch::new(None, Duration::from_secs(10), Duration::from_secs(60));
        let mut client = ClientFrames::new(watch.clone());
        let mut input = preface();
        // A forged name, then a literal whose Huffman value declares 41
        // bytes and sends none: the naming frame would become its value.
        let mut block = b"\x82\x86\x84\x01\x04test\x00\x13floodgate-h2-stream\x03f:1".to_vec();
        block.extend(b"\x00\x01x\xa9");
        input.extend(frame(HEADERS, END_HEADERS | END_STREAM, 1, &block));
        let out = read_all(&mut client, &input, by_byte);
        let mut expected = preface();
        expected.extend(frame(HEADERS, END_STREAM, 1, &block));
        expected.extend(frame(CONTINUATION, END_HEADERS, 1, b""));
        assert_eq!(out, expected, "by byte: {by_byte}");
    }
}

#[test]
fn padding_and_priority_are_not_read_as_the_block() {
    let watch = H2Watch::new(None, Duration::from_secs(10), Duration::from_secs(60));
    let mut client = ClientFrames::new(watch.clone());
    // Pad length 4, a priority, the fragment, then padding bytes that
    // would read as an unfinished literal.
    let mut payload = vec![4u8];
    payload.extend([0, 0, 0, 0, 16]);
    payload.extend(b"\x82\x86\x84");
    payload.extend([0x00, 0x7f, 0x00, 0x00]);
    let mut input = preface();
    input.extend(frame(
        HEADERS,
        END_HEADERS | PADDED | PRIORITY_FLAG,
        1,
        &payload,
    ));
    // Split across a CONTINUATION: the field's value is in the second.
    input.extend(frame(HEADERS, PADDED, 3, b"\x01\x82\x00\x01x\x03\x00"));
    input.extend(frame(CONTINUATION, END_HEADERS, 3, b"abc"));
    let out = read_all(&mut client, &input, true);
    let mut expected = preface();
    expected.extend(frame(HEADERS, PADDED | PRIORITY_FLAG, 1, &payload));
    expected.extend(named(watch.id, 1));
    expected.extend(frame(HEADERS, PADDED, 3, b"\x01\x82\x00\x01x\x03\x00"));
    expected.extend(frame(CONTINUATION, 0, 3, b"abc"));
    expected.extend(named(watch.id, 3));
    assert_eq!(out, expected);
    // Padding longer than the frame: nothing appended.
    let watch = H2Watch::new(None, Duration::from_secs(10), Duration::from_secs(60));
    let mut client = ClientFrames::new(watch.clone());
    let mut input = preface();
    input.extend(frame(HEADERS, END_HEADERS | PADDED, 1, b"\x09\x82"));
    let out = read_all(&mut client, &input, false);
    assert!(out.ends_with(&frame(CONTINUATION, END_HEADERS, 1, b"")));
}

#[test]
fn nothing_of_the_watchs_goes_inside_a_header_block() {
    let watch = H2Watch::new(None, Duration::from_secs(1), Duration::from_secs(60));
    let mut client = ClientFrames::new(watch.clone());
    let mut input = preface();
    input.extend(frame(HEADERS, END_HEADERS, 1, b"\x82"));
    // Stream 3's block begins and stays open.
    input.extend(frame(HEADERS, END_STREAM, 3, b"\x82"));
    let mut out = read_all(&mut client, &input, false);
    watch.client_left();
    assert!(watch.has_inbound(), "stream 1's body is cut");
    assert!(!client.between_frames());
    let (id, until) = client.inside_frame().expect("a block is open");
    assert_eq!(id, 3);
    assert!(until <= Instant::now() + Duration::from_secs(1));
    out.extend(read_all(
        &mut client,
        &frame(CONTINUATION, 0, 3, b"\x86"),
        false,
    ));
    out.extend(read_all(
        &mut client,
        &frame(CONTINUATION, END_HEADERS, 3, b"\x84"),
        false,
    ));
    assert!(client.between_frames());
    out.extend(read_all(
        &mut client,
        &frame(PRIORITY, 0, 9, &[0, 0, 0, 0, 16]),
        false,
    ));
    let mut expected = preface();
    expected.extend(frame(HEADERS, 0, 1, b"\x82"));
    expected.extend(named(watch.id, 1));
    expected.extend(frame(HEADERS, END_STREAM, 3, b"\x82"));
    expected.extend(frame(CONTINUATION, 0, 3, b"\x86"));
    expected.extend(frame(CONTINUATION, 0, 3, b"\x84"));
    expected.extend(named(watch.id, 3));
    // Only now, after the block, the cut goes in.
    expected.extend(self_dependency(1));
    expected.extend(frame(PRIORITY, 0, 9, &[0, 0, 0, 0, 16]));
    assert_eq!(out, expected);
}

#[test]
fn a_stream_is_claimed_once_and_only_from_its_own_connection() {
    let socket = Arc::new(SocketDigest::from_raw_fd(7));
    let other = Arc::new(SocketDigest::from_raw_fd(7));
    let watch = H2Watch::new(
        Some(socket.clone()),
        Duration::from_secs(10),
        Duration::from_secs(60),
    );
    let mut client = ClientFrames::new(watch.clone());
    let mut input = preface();
    input.extend(frame(HEADERS, END_HEADERS | END_STREAM, 1, b"\x82"));
    read_all(&mut client, &input, false);
    let value: http::HeaderValue = format!("{:x}:1", watch.id).parse().unwrap();
    assert!(H2Stream::named(&value, Some(&other)).is_none());
    assert!(H2Stream::named(&value, None).is_none());
    let first = H2Stream::named(&value, Some(&socket)).expect("its own stream");
    assert!(H2Stream::named(&value, Some(&socket)).is_none(), "claimed");
    let unknown: http::HeaderValue = format!("{:x}:3", watch.id).parse().unwrap();
    assert!(H2Stream::named(&unknown, Some(&socket)).is_none());
    drop(first);
}

#[test]
fn a_stream_beyond_what_is_followed_is_cut_as_it_opens() {
    let watch = H2Watch::new(None, Duration::from_secs(10), Duration::from_secs(60));
    let mut client = ClientFrames::new(watch.clone());
    let mut input = preface();
    for i in 0..=MOST_STREAMS as u32 {
        input.extend(frame(HEADERS, END_HEADERS, 2 * i + 1, b"\x82"));
    }
    read_all(&mut client, &input, false);
    let last = 2 * MOST_STREAMS as u32 + 1;
    assert!(!watch.shared().streams.contains_key(&last));
    let mut buf = [0u8; 64];
    let n = watch.pending_inbound(&mut buf, Waker::noop());
    assert_eq!(&buf[..n], &self_dependency(last)[..]);
}
