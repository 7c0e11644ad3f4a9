//! A run's egress forward, guest side: a listener on the guest's loopback
//! ([`proxy_port`] of the port), bound at boot and held by the agent for the VM's life (so no
//! command can squat on it), whose connections are carried over the run's session to the host,
//! which opens one connection to the box's egress proxy for each (the pinned allowlist and the
//! tally are the host's).
//!
//! Must never: forward a connection while no run that may reach egress is going on its port
//! (it is accepted and closed), hold more than [`MAX_CONNS`] at once, or keep a connection of
//! a run that ended.

use std::collections::HashMap;
use std::io::{self, Read};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;

use h5i_guest::proto::{conn_id, proxy_port, write_pending, Frame, Kind, NetData, MAX_CONNS};

use crate::Outbox;

/// One forwarded connection.
struct Conn {
    stream: TcpStream,
    /// Bytes from the proxy the command has not taken yet.
    to_command: Vec<u8>,
    /// The proxy ended its side (shut the command's read side once `to_command` is written).
    proxy_done: bool,
    /// The command ended its side (told to the host).
    command_done: bool,
}

/// The forward of one port.
pub struct Forward {
    listener: TcpListener,
    conns: HashMap<u32, Conn>,
    next_id: u32,
    open: bool,
}

impl Forward {
    /// Bind port `index`'s listener on the guest's loopback.
    pub fn bind(index: usize) -> io::Result<Forward> {
        let listener = TcpListener::bind(("127.0.0.1", proxy_port(index)))?;
        listener.set_nonblocking(true)?;
        Ok(Forward {
            listener,
            conns: HashMap::new(),
            next_id: 0,
            open: false,
        })
    }

    /// A run that may reach egress started on this port.
    pub fn open(&mut self) {
        self.open = true;
    }

    /// The run ended (or none is going): drop every connection, forward nothing more.
    pub fn close(&mut self) {
        self.open = false;
        self.conns.clear();
    }

    /// A host frame for the forward.
    pub fn take_host_frame(&mut self, frame: &Frame) {
        match frame.kind {
            Kind::NetToGuest => {
                if let Ok(d) = NetData::decode(&frame.payload) {
                    if let Some(c) = self.conns.get_mut(&d.id) {
                        c.to_command.extend_from_slice(d.bytes);
                    }
                }
            }
            Kind::NetCloseToGuest => {
                if let Some(c) = conn_id(&frame.payload)
                    .ok()
                    .and_then(|id| self.conns.get_mut(&id))
                {
                    c.proxy_done = true;
                }
            }
            _ => {}
        }
    }

    /// Accept what is waiting, move bytes both ways without blocking (reading from commands
    /// only while `reading`: the outbox has room), and tell `session` of every open, byte and
    /// close; with no session every connection is accepted and closed.
    pub fn pump(
        &mut self,
        session: Option<u32>,
        outbox: &mut Outbox,
        reading: bool,
        buf: &mut [u8],
    ) {
        while let Ok((stream, _)) = self.listener.accept() {
            let Some(s) = session.filter(|_| self.open && self.conns.len() < MAX_CONNS) else {
                continue;
            };
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let id = self.next_id;
            self.next_id = self.next_id.wrapping_add(1);
            outbox.push(Kind::NetOpen, s, &id.to_le_bytes());
            self.conns.insert(
                id,
                Conn {
                    stream,
                    to_command: Vec::new(),
                    proxy_done: false,
                    command_done: false,
                },
            );
        }
        let Some(s) = session else {
            self.conns.clear();
            return;
        };
        let mut gone = Vec::new();
        for (id, c) in &mut self.conns {
            if write_pending(&mut c.stream, &mut c.to_command).is_err() {
                c.to_command.clear();
                c.proxy_done = true;
                if !c.command_done {
                    c.command_done = true;
                    outbox.push(Kind::NetCloseFromGuest, s, &id.to_le_bytes());
                }
            }
            if c.proxy_done && c.to_command.is_empty() {
                let _ = c.stream.shutdown(Shutdown::Write);
            }
            if reading && !c.command_done {
                match c.stream.read(buf) {
                    Ok(0) => {
                        c.command_done = true;
                        outbox.push(Kind::NetCloseFromGuest, s, &id.to_le_bytes());
                    }
                    Ok(n) => outbox.push(Kind::NetFromGuest, s, &NetData::encode(*id, &buf[..n])),
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                        ) => {}
                    Err(_) => {
                        c.command_done = true;
                        c.proxy_done = true;
                        c.to_command.clear();
                        outbox.push(Kind::NetCloseFromGuest, s, &id.to_le_bytes());
                    }
                }
            }
            if c.command_done && c.proxy_done && c.to_command.is_empty() {
                gone.push(*id);
            }
        }
        for id in gone {
            self.conns.remove(&id);
        }
    }

    /// What to poll: the listener, every connection the command may still send on (while
    /// `reading`), and every one with bytes waiting for the command.
    pub fn poll_fds(&self, reading: bool) -> Vec<(libc::c_int, libc::c_short)> {
        let mut fds = vec![(self.listener.as_raw_fd(), libc::POLLIN)];
        for c in self.conns.values() {
            let mut ev = 0;
            if reading && !c.command_done {
                ev |= libc::POLLIN;
            }
            if !c.to_command.is_empty() {
                ev |= libc::POLLOUT;
            }
            if ev != 0 {
                fds.push((c.stream.as_raw_fd(), ev));
            }
        }
        fds
    }
}
