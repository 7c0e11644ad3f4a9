//! The accept loop both proxies share: one thread waits on the caller's listener and a wake
//! pipe, each accepted connection gets its own thread, and shutdown ends all of them.
//!
//! Owns accepting (bounded in-flight connections; one over the bound is answered `503` and held
//! in the accept loop's poll set, briefly and boundedly, until its client has read it), the
//! registry of every socket a connection holds (so shutdown can end a tunnel blocked in a
//! read), and a bounded wait for connection threads at stop. Must never: fork, bind a listener of its own (the caller creates it, inside
//! a box's network namespace when it must be), or outlive [`Server::shutdown`] with a live
//! socket.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The sockets of every live connection, by connection id, each under its own key.
#[derive(Default)]
pub(crate) struct Registry {
    conns: Mutex<HashMap<u64, Vec<(u64, TcpStream)>>>,
    next_key: AtomicU64,
    live: Mutex<usize>,
    ended: Condvar,
    stopping: AtomicBool,
}

impl Registry {
    /// Track `sock` (a clone) under connection `id`, so shutdown can end it; the key untracks
    /// it. Refused once stopping, so a connection racing the stop cannot slip a socket past it.
    fn track(&self, id: u64, sock: &TcpStream) -> io::Result<u64> {
        let clone = sock.try_clone()?;
        let key = self.next_key.fetch_add(1, Ordering::Relaxed);
        let mut conns = self
            .conns
            .lock()
            .map_err(|_| io::Error::other("connection registry poisoned"))?;
        if self.stopping.load(Ordering::SeqCst) {
            let _ = clone.shutdown(Shutdown::Both);
            return Err(io::Error::other("the proxy is stopping"));
        }
        conns.entry(id).or_default().push((key, clone));
        Ok(key)
    }

    fn untrack(&self, id: u64, key: u64) {
        if let Ok(mut conns) = self.conns.lock() {
            if let Some(v) = conns.get_mut(&id) {
                v.retain(|(k, _)| *k != key);
            }
        }
    }

    fn forget(&self, id: u64) {
        if let Ok(mut conns) = self.conns.lock() {
            conns.remove(&id);
        }
    }

    fn shutdown_all(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        if let Ok(conns) = self.conns.lock() {
            for socks in conns.values() {
                for (_, s) in socks {
                    let _ = s.shutdown(Shutdown::Both);
                }
            }
        }
    }
}

/// What a connection thread is handed.
pub(crate) struct Conn {
    /// This connection's id.
    pub id: u64,
    /// The accepted socket (blocking, `TCP_NODELAY`).
    pub stream: TcpStream,
    /// Where to track further sockets the connection opens.
    pub registry: Arc<Registry>,
}

impl Conn {
    /// Track another socket this connection holds (an upstream) until the guard drops, so a
    /// long-lived connection that dials many upstreams holds no stale descriptors.
    pub(crate) fn track(&self, sock: &TcpStream) -> io::Result<Tracked> {
        let key = self.registry.track(self.id, sock)?;
        Ok(Tracked {
            registry: Arc::clone(&self.registry),
            id: self.id,
            key,
        })
    }
}

/// A tracked socket; dropping it stops tracking (the socket itself is owned elsewhere).
pub(crate) struct Tracked {
    registry: Arc<Registry>,
    id: u64,
    key: u64,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.registry.untrack(self.id, self.key);
    }
}

/// Ends a connection's bookkeeping even if its handler panics.
struct ConnEnd {
    registry: Arc<Registry>,
    id: u64,
}

impl Drop for ConnEnd {
    fn drop(&mut self) {
        end_conn(&self.registry, self.id);
    }
}

/// A running accept loop.
pub(crate) struct Server {
    local: SocketAddr,
    wake: UnixStream,
    accept: Option<JoinHandle<()>>,
    registry: Arc<Registry>,
}

/// Connections above this count are answered `503` and closed.
pub(crate) const MAX_CONNECTIONS: usize = 512;

/// Refused connections held at once while their clients read the `503`; past it the oldest
/// is closed first.
const MAX_REFUSED: usize = 512;

/// How long a refused connection is held open (its input read and dropped) for the client to
/// read the `503` and close: closing at once, with the client's request unread or still on
/// its way, answers it with a reset that can discard the `503` from the client's queue.
const REFUSED_LINGER: Duration = Duration::from_secs(2);

/// Connections refused over the cap: the `503` written and the write side shut down, each
/// read (and its bytes dropped) until its client closes or its linger ends.
#[derive(Default)]
struct Refused {
    held: std::collections::VecDeque<(TcpStream, Instant)>,
}

impl Refused {
    /// Answer `stream` with `busy`, shut its write side (the client sees the `503` and then
    /// end of file) and hold it.
    fn refuse(&mut self, mut stream: TcpStream, busy: fn(&mut TcpStream)) {
        busy(&mut stream);
        if stream.shutdown(Shutdown::Write).is_err() || stream.set_nonblocking(true).is_err() {
            return;
        }
        if self.held.len() >= MAX_REFUSED {
            self.held.pop_front();
        }
        self.held
            .push_back((stream, Instant::now() + REFUSED_LINGER));
    }

    /// The poll timeout (ms) until the next linger ends; -1 when none is held.
    fn timeout_ms(&self) -> i32 {
        self.held.front().map_or(-1, |(_, until)| {
            let left = until.saturating_duration_since(Instant::now());
            i32::try_from(left.as_millis()).unwrap_or(i32::MAX).max(1)
        })
    }

    /// Read what each readable held connection sent, dropping it, and close those whose
    /// client closed (or failed) and those whose linger ended.
    fn serve(&mut self, readable: &[bool]) {
        let now = Instant::now();
        let mut scratch = [0u8; 4096];
        let mut i = 0;
        self.held.retain_mut(|(stream, until)| {
            let ready = readable.get(i).copied().unwrap_or(false);
            i += 1;
            if *until <= now {
                return false;
            }
            if !ready {
                return true;
            }
            loop {
                match stream.read(&mut scratch) {
                    Ok(0) => return false,
                    Ok(_) => continue,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => return false,
                }
            }
        });
    }
}

impl Server {
    /// Serve `listener`, handing each connection to `handle` on its own thread. `busy` writes
    /// the refusal for a connection over [`MAX_CONNECTIONS`].
    pub(crate) fn start(
        listener: TcpListener,
        name: &'static str,
        handle: Arc<dyn Fn(Conn) + Send + Sync>,
        busy: fn(&mut TcpStream),
    ) -> io::Result<Server> {
        let local = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let (wake, wake_rx) = UnixStream::pair()?;
        wake_rx.set_nonblocking(true)?;
        let registry = Arc::new(Registry::default());
        let reg = Arc::clone(&registry);
        let accept = std::thread::Builder::new()
            .name(format!("h5i-{name}-accept"))
            .spawn(move || accept_loop(listener, wake_rx, reg, name, handle, busy))?;
        Ok(Server {
            local,
            wake,
            accept: Some(accept),
            registry,
        })
    }

    /// The listener's address.
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Stop accepting, end every live connection, and wait (at most `grace`) for their threads.
    /// Returns how many connection threads were still running when the wait gave up.
    pub(crate) fn shutdown(&mut self, grace: Duration) -> usize {
        let _ = (&self.wake).write_all(b"x");
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
        self.registry.shutdown_all();
        let deadline = Instant::now() + grace;
        let Ok(mut live) = self.registry.live.lock() else {
            return 0;
        };
        while *live > 0 {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            match self.registry.ended.wait_timeout(live, deadline - now) {
                Ok((l, _)) => live = l,
                Err(_) => return 0,
            }
        }
        *live
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.accept.is_some() {
            self.shutdown(Duration::from_secs(2));
        }
    }
}

fn accept_loop(
    listener: TcpListener,
    wake: UnixStream,
    registry: Arc<Registry>,
    name: &'static str,
    handle: Arc<dyn Fn(Conn) + Send + Sync>,
    busy: fn(&mut TcpStream),
) {
    let next_id = AtomicU64::new(1);
    let mut refused = Refused::default();
    loop {
        let pollfd = |fd: i32| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let mut fds = vec![pollfd(listener.as_raw_fd()), pollfd(wake.as_raw_fd())];
        fds.extend(refused.held.iter().map(|(s, _)| pollfd(s.as_raw_fd())));
        // Every descriptor in `fds` stays open for the wait (the listener and wake socket are
        // owned by this frame, the refused streams by `refused`).
        let timeout = u64::try_from(refused.timeout_ms())
            .ok()
            .map(std::time::Duration::from_millis);
        match h5i_sys::poll::wait(&mut fds, timeout) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        }
        if fds[1].revents != 0 {
            return;
        }
        let readable: Vec<bool> = fds[2..].iter().map(|f| f.revents != 0).collect();
        refused.serve(&readable);
        if fds[0].revents == 0 {
            continue;
        }
        loop {
            match listener.accept() {
                Ok((stream, _peer)) => {
                    let _ = stream.set_nonblocking(false);
                    let _ = stream.set_nodelay(true);
                    if let Some(over) = spawn_conn(&registry, &next_id, name, &handle, stream) {
                        refused.refuse(over, busy);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // ECONNABORTED and friends: the peer gave up; keep serving. EMFILE: back off a
                // little instead of spinning.
                Err(e) if e.raw_os_error() == Some(libc::EMFILE) => {
                    std::thread::sleep(Duration::from_millis(20));
                    break;
                }
                Err(_) => break,
            }
        }
    }
}

/// Hand `stream` to a connection thread; gives it back when it is over [`MAX_CONNECTIONS`].
fn spawn_conn(
    registry: &Arc<Registry>,
    next_id: &AtomicU64,
    name: &'static str,
    handle: &Arc<dyn Fn(Conn) + Send + Sync>,
    stream: TcpStream,
) -> Option<TcpStream> {
    {
        let Ok(mut live) = registry.live.lock() else {
            return None;
        };
        if *live >= MAX_CONNECTIONS {
            return Some(stream);
        }
        *live += 1;
    }
    let id = next_id.fetch_add(1, Ordering::Relaxed);
    if registry.track(id, &stream).is_err() {
        end_conn(registry, id);
        return None;
    }
    let reg = Arc::clone(registry);
    let h = Arc::clone(handle);
    let spawned = std::thread::Builder::new()
        .name(format!("h5i-{name}-conn"))
        .spawn(move || {
            let _end = ConnEnd {
                registry: Arc::clone(&reg),
                id,
            };
            let conn = Conn {
                id,
                stream,
                registry: reg,
            };
            h(conn);
        });
    if spawned.is_err() {
        end_conn(registry, id);
    }
    None
}

fn end_conn(registry: &Registry, id: u64) {
    registry.forget(id);
    if let Ok(mut live) = registry.live.lock() {
        *live = live.saturating_sub(1);
        registry.ended.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_client_reads_the_refusal_and_one_that_never_closes_is_dropped_at_its_linger() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (accepted, _) = l.accept().unwrap();
        let mut refused = Refused::default();
        refused.refuse(accepted, |s| {
            let _ = s.write_all(b"HTTP/1.1 503 busy\r\n\r\n");
        });
        // The request arrives after the refusal was written: it is read, not answered with a
        // reset, and the client reads the whole refusal and then end of file.
        client
            .write_all(b"CONNECT a.test:443 HTTP/1.1\r\n\r\n")
            .unwrap();
        let mut got = Vec::new();
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        client.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"HTTP/1.1 503 busy\r\n\r\n");
        refused.serve(&[true]);
        assert_eq!(refused.held.len(), 1, "dropped before the client closed");
        // A hostile client keeps sending and never closes: held only until its linger ends.
        client.write_all(&[b'x'; 1000]).unwrap();
        refused.serve(&[true]);
        assert_eq!(refused.held.len(), 1);
        refused.held[0].1 = Instant::now();
        refused.serve(&[false]);
        assert!(refused.held.is_empty(), "held past its linger");
        assert_eq!(refused.timeout_ms(), -1);
    }

    #[test]
    fn a_tracked_socket_is_untracked_when_its_guard_drops() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let registry = Arc::new(Registry::default());
        let conn = Conn {
            id: 7,
            stream: a.try_clone().unwrap(),
            registry: Arc::clone(&registry),
        };
        let count = || registry.conns.lock().unwrap().get(&7).map_or(0, Vec::len);
        for _ in 0..100 {
            let _g = conn.track(&a).unwrap();
            assert_eq!(count(), 1);
        }
        assert_eq!(
            count(),
            0,
            "a long-lived connection keeps stale descriptors"
        );
        let _g = conn.track(&a).unwrap();
        registry.shutdown_all();
        assert!(conn.track(&a).is_err(), "tracking after stop was accepted");
    }
}
