//! Sending a connection's frames from the caller's own thread.
//!
//! A caller queues its frame's pieces (header, body, payload) and, when
//! no other caller is writing, writes the queue to the socket itself with
//! non-blocking vectored writes. Only when the socket is full does a task
//! take over the rest and wait until it can write again. A request thus
//! leaves on the thread that made it: no hand-over to a writer task, no
//! wake-up of another thread (a mount's request made on its FUSE thread goes
//! out from there). Callers that arrive while one writes only queue: the
//! writer takes their frames along, several per system call under load.
//!
//! Frames never interleave (a frame's pieces are queued together, under the
//! queue's lock) and leave in the order they were queued. Bodies and payloads
//! are written from the caller's buffers, never copied; a header is kept
//! inline; a write allocates nothing. This module must not know
//! what a frame means: it writes bytes and reports a dead socket.

use bytes::{Buf, Bytes};
use hivefs_proto::HEADER_LEN;
use std::collections::VecDeque;
use std::io::IoSlice;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::net::tcp::OwnedWriteHalf;
use tracing::debug;

/// Pieces handed to one vectored write at most.
const IOV_MAX: usize = 64;

/// A piece of a queued frame: its header (inline, with how much of it was
/// written already) or a shared buffer (body, payload).
enum Piece {
    Head([u8; HEADER_LEN], usize),
    Buf(Bytes),
}

impl Piece {
    /// What is left to write of it.
    fn rest(&self) -> &[u8] {
        match self {
            Piece::Head(h, from) => &h[*from..],
            Piece::Buf(b) => b,
        }
    }

    fn advance(&mut self, n: usize) {
        match self {
            Piece::Head(_, from) => *from += n,
            Piece::Buf(b) => b.advance(n),
        }
    }
}

struct Queue {
    pieces: VecDeque<Piece>,
    /// A caller or the flush task is writing: the others only queue.
    busy: bool,
    /// The writer's batch, kept between writes so that none allocates.
    spare: Vec<Piece>,
    /// The flush task writing the rest while the socket was full.
    flush: Option<tokio::task::AbortHandle>,
}

/// The write side of one connection.
pub(crate) struct Sender {
    wr: OwnedWriteHalf,
    queue: Mutex<Queue>,
    dead: Arc<AtomicBool>,
    rt: tokio::runtime::Handle,
    peer: String,
}

/// What one round of writing found.
enum Wrote {
    /// The queue is empty; nobody writes now.
    All,
    /// The socket is full; the queue still holds the rest.
    Full,
    /// The socket failed: the connection is dead.
    Failed,
}

impl Sender {
    /// Must be made inside a runtime (its flush task runs there).
    pub(crate) fn new(wr: OwnedWriteHalf, dead: Arc<AtomicBool>, peer: &str) -> Sender {
        let queue = Queue { pieces: VecDeque::new(), busy: false, spare: Vec::with_capacity(IOV_MAX), flush: None };
        let rt = tokio::runtime::Handle::current();
        Sender { wr, queue: Mutex::new(queue), dead, rt, peer: peer.to_string() }
    }

    /// Queues one frame and writes whatever the socket takes now unless
    /// another caller is writing. Returns false when the connection is dead
    /// (the frame is not sent).
    pub(crate) fn send(self: &Arc<Self>, header: [u8; HEADER_LEN], body: Bytes, payload: Bytes) -> bool {
        if self.dead.load(Ordering::Acquire) {
            return false;
        }
        {
            let mut q = self.queue.lock().expect("send queue");
            q.pieces.push_back(Piece::Head(header, 0));
            for b in [body, payload] {
                if !b.is_empty() {
                    q.pieces.push_back(Piece::Buf(b));
                }
            }
            if q.busy {
                return true;
            }
            q.busy = true;
        }
        match self.write_some() {
            Wrote::All | Wrote::Failed => {}
            Wrote::Full => {
                let me = self.clone();
                let task = self.rt.spawn(async move { me.flush_rest().await });
                let mut q = self.queue.lock().expect("send queue");
                q.flush = Some(task.abort_handle());
            }
        }
        !self.dead.load(Ordering::Acquire)
    }

    /// Writes queued pieces until the queue is empty or the socket is full;
    /// the caller holds the writing role (`busy`), and gives it up here when
    /// the queue is empty.
    fn write_some(&self) -> Wrote {
        loop {
            // The lock is held only to take pieces off the queue's front and
            // to put back what was not written; the write runs without it.
            let mut batch = {
                let mut q = self.queue.lock().expect("send queue");
                if q.pieces.is_empty() {
                    q.busy = false;
                    return Wrote::All;
                }
                let mut batch = std::mem::take(&mut q.spare);
                let n = q.pieces.len().min(IOV_MAX);
                batch.extend(q.pieces.drain(..n));
                batch
            };
            let mut iov = [IoSlice::new(&[]); IOV_MAX];
            for (slice, p) in iov.iter_mut().zip(&batch) {
                *slice = IoSlice::new(p.rest());
            }
            let (written, full) = match self.wr.try_write_vectored(&iov[..batch.len()]) {
                Ok(n) => (n, false),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => (0, true),
                Err(e) => {
                    debug!(peer = %self.peer, "write failed: {e}");
                    self.dead.store(true, Ordering::Release);
                    // `busy` stays: nothing is written to a dead socket again.
                    self.queue.lock().expect("send queue").pieces.clear();
                    return Wrote::Failed;
                }
            };
            let (mut left, mut done) = (written, 0);
            for p in batch.iter_mut() {
                let len = p.rest().len();
                if left < len {
                    p.advance(left);
                    break;
                }
                left -= len;
                done += 1;
            }
            batch.drain(..done);
            // What was not written goes back to the front, before anything
            // queued meanwhile.
            let mut q = self.queue.lock().expect("send queue");
            while let Some(p) = batch.pop() {
                q.pieces.push_front(p);
            }
            q.spare = batch;
            if full {
                return Wrote::Full;
            }
        }
    }

    /// The flush task: waits until the socket takes more, until the queue
    /// is empty (then the next caller writes again itself).
    async fn flush_rest(self: Arc<Self>) {
        loop {
            if let Err(e) = self.wr.writable().await {
                debug!(peer = %self.peer, "write failed: {e}");
                self.dead.store(true, Ordering::Release);
                return;
            }
            match self.write_some() {
                Wrote::Full => continue,
                Wrote::All | Wrote::Failed => return,
            }
        }
    }

    /// The connection is given up: a flush task still waiting for the
    /// socket stops (and drops its hold of the socket).
    pub(crate) fn stop(&self) {
        if let Some(t) = self.queue.lock().expect("send queue").flush.take() {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// Frames from many callers, some larger than the socket's buffers,
    /// arrive whole and in the order each caller sent them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn frames_arrive_whole_and_in_order_when_the_socket_fills() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut server, _) = l.accept().await.unwrap();
        let (_rd, wr) = client.into_split();
        let dead = Arc::new(AtomicBool::new(false));
        let s = Arc::new(Sender::new(wr, dead.clone(), "test"));
        // Frame: a header carrying sender, sequence and payload length in its
        // first 12 bytes, a body of the sequence again, the payload.
        let senders: u32 = 4;
        let per: u32 = 50;
        let mut tasks = Vec::new();
        for who in 0..senders {
            let s = s.clone();
            tasks.push(std::thread::spawn(move || {
                for seq in 0..per {
                    let len = if seq % 7 == 0 { 3 << 20 } else { (seq as usize * 131) % 5000 };
                    let payload: Vec<u8> = (0..len).map(|i| (i as u32 ^ who ^ seq) as u8).collect();
                    let mut head = [0u8; HEADER_LEN];
                    head[0..4].copy_from_slice(&who.to_le_bytes());
                    head[4..8].copy_from_slice(&seq.to_le_bytes());
                    head[8..12].copy_from_slice(&(len as u32).to_le_bytes());
                    let body = Bytes::from(seq.to_le_bytes().to_vec());
                    assert!(s.send(head, body, Bytes::from(payload)));
                }
            }));
        }
        let mut next = vec![0u32; senders as usize];
        for _ in 0..senders * per {
            let mut h = [0u8; HEADER_LEN + 4];
            server.read_exact(&mut h).await.unwrap();
            assert_eq!(h[4..8], h[HEADER_LEN..], "a body follows its own header");
            let who = u32::from_le_bytes(h[0..4].try_into().unwrap());
            let seq = u32::from_le_bytes(h[4..8].try_into().unwrap());
            let len = u32::from_le_bytes(h[8..12].try_into().unwrap()) as usize;
            assert_eq!(seq, next[who as usize], "frames of sender {who} out of order");
            next[who as usize] += 1;
            let mut p = vec![0u8; len];
            server.read_exact(&mut p).await.unwrap();
            assert!(p.iter().enumerate().all(|(i, &b)| b == (i as u32 ^ who ^ seq) as u8), "payload of {who}/{seq}");
        }
        for t in tasks {
            t.join().unwrap();
        }
        assert!(!dead.load(Ordering::Acquire));
    }

    /// A socket whose peer is gone makes the connection dead, and later
    /// sends say so.
    #[tokio::test]
    async fn a_closed_peer_makes_the_sender_dead() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = tokio::net::TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (server, _) = l.accept().await.unwrap();
        drop(server);
        let (_rd, wr) = client.into_split();
        let dead = Arc::new(AtomicBool::new(false));
        let s = Arc::new(Sender::new(wr, dead.clone(), "test"));
        let mut sent = 0;
        while s.send([0u8; HEADER_LEN], Bytes::from(vec![0u8; 4096]), Bytes::new()) {
            sent += 1;
            assert!(sent < 10_000, "writes to a closed peer never failed");
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        assert!(dead.load(Ordering::Acquire));
    }
}
