//! The accept loop both proxies share: one thread waits on the caller's listener and a wake
//! pipe, each accepted connection gets its own thread, and shutdown ends all of them.
//!
//! Owns accepting (bounded in-flight connections), the registry of every socket a connection
//! holds (so shutdown can end a tunnel blocked in a read), and a bounded wait for connection
//! threads at stop. Must never: fork, bind a listener of its own (the caller creates it, inside
//! a box's network namespace when it must be), or outlive [`Server::shutdown`] with a live
//! socket.

use std::collections::HashMap;
use std::io::{self, Write};
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
    loop {
        let mut fds = [
            libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a valid array of two initialized pollfd structs for the length given,
        // and both descriptors stay open for the duration of the call (owned by this frame).
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        if fds[1].revents != 0 {
            return;
        }
        loop {
            match listener.accept() {
                Ok((stream, _peer)) => {
                    let _ = stream.set_nonblocking(false);
                    let _ = stream.set_nodelay(true);
                    spawn_conn(&registry, &next_id, name, &handle, busy, stream);
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

fn spawn_conn(
    registry: &Arc<Registry>,
    next_id: &AtomicU64,
    name: &'static str,
    handle: &Arc<dyn Fn(Conn) + Send + Sync>,
    busy: fn(&mut TcpStream),
    mut stream: TcpStream,
) {
    {
        let Ok(mut live) = registry.live.lock() else {
            return;
        };
        if *live >= MAX_CONNECTIONS {
            drop(live);
            busy(&mut stream);
            return;
        }
        *live += 1;
    }
    let id = next_id.fetch_add(1, Ordering::Relaxed);
    if registry.track(id, &stream).is_err() {
        end_conn(registry, id);
        return;
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
