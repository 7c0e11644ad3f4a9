//! The host end of a microvm run's egress forward: the broker's egress proxy (the pinned
//! allowlist, the per-request tally, the first denied attempts) on a listener in a network
//! namespace of its own, and the connections to it that carry the guest's forwarded ones.
//!
//! The guest has no network device. A command in it reaches the network only by connecting to
//! its port's forward on the guest's loopback (`HTTPS_PROXY`); the guest agent carries each
//! connection over the run's session, and [`Forward::connect`] opens one connection to the
//! proxy for it. So a raw socket to any address, listed or not, has no route, and every
//! destination the box reaches is one the proxy allowed and counted: enforcement as strict as
//! msb's address rules, with the tally msb cannot give.
//!
//! The proxy's listener is made by a thread that moved to a fresh network namespace (holding
//! only `lo`): no host process can reach it, so nothing but this run's guest adds to its tally.
//! The proxy's own threads stay in the host's namespace and dial the pinned addresses from
//! there. Making a namespace needs root; an unprivileged caller's box with egress is refused.
//!
//! Must never: listen where a host process can connect, resolve a name after the run starts,
//! or outlive the run.

use std::io;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread::JoinHandle;

use h5i_broker::egress::{EgressOptions, EgressPlan, EgressProxy, EgressReport};

use crate::error::BoxError;

/// A request for one connection to the proxy, answered on the enclosed channel.
type ConnectRequest = mpsc::Sender<io::Result<TcpStream>>;

/// The proxy of one run and the namespace its listener lives in.
pub struct Forward {
    proxy: EgressProxy,
    requests: mpsc::Sender<ConnectRequest>,
    namespace: JoinHandle<()>,
}

impl std::fmt::Debug for Forward {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forward")
            .field("proxy", &self.proxy)
            .finish_non_exhaustive()
    }
}

/// In the calling thread, move to a new network namespace, bring its `lo` up and listen there.
fn listen_in_a_namespace_of_its_own() -> io::Result<TcpListener> {
    // Only the calling thread moves: a thread of h5i's own that serves nothing else.
    h5i_sys::ns::unshare_net()?;
    h5i_sys::netif::set_up("lo")?;
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
}

impl Forward {
    /// Serve `plan` for one run.
    pub fn start(plan: EgressPlan) -> Result<Forward, BoxError> {
        let (made_tx, made_rx) = mpsc::channel();
        let (requests, incoming) = mpsc::channel::<ConnectRequest>();
        let namespace = std::thread::spawn(move || {
            let made = listen_in_a_namespace_of_its_own();
            let addr = made.as_ref().ok().and_then(|l| l.local_addr().ok());
            let _ = made_tx.send(made);
            let Some(addr) = addr else { return };
            for reply in incoming {
                let _ = reply.send(TcpStream::connect(addr));
            }
        });
        let refuse = |e: String| {
            BoxError::BadRequest {
            what: format!("cannot make the microvm run's egress forward: {e}"),
            mend: "run h5i as root for a microvm box with net.egress (the forward's listener lives in a network namespace of its own), or use isolation supervised".into(),
        }
        };
        let listener = made_rx
            .recv()
            .map_err(|e| refuse(e.to_string()))?
            .map_err(|e| refuse(e.to_string()))?;
        let proxy = EgressProxy::serve(listener, plan, EgressOptions::default())
            .map_err(|e| refuse(e.to_string()))?;
        Ok(Forward {
            proxy,
            requests,
            namespace,
        })
    }

    /// A new connection to the proxy (made in its namespace).
    pub fn connect(&self) -> io::Result<TcpStream> {
        let (tx, rx) = mpsc::channel();
        self.requests
            .send(tx)
            .map_err(|_| io::Error::other("the forward's namespace thread is gone"))?;
        rx.recv()
            .map_err(|_| io::Error::other("the forward's namespace thread is gone"))?
    }

    /// After the run: stop the proxy and return what it saw.
    pub fn finish(self) -> EgressReport {
        drop(self.requests);
        let _ = self.namespace.join();
        self.proxy.shutdown()
    }
}
