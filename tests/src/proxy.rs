//! A TCP proxy that a test can cut and restore, to play a database outage without stopping the
//! shared server (other tests use it at the same time), and delay, to play a slow link (a
//! replication stream that lags). Cutting drops what is still held back by the delay: those
//! bytes never arrive, as on a link that failed. In front of a Redis master that clients reach
//! through it too (a cluster node announcing the proxy's port), the delay can be kept to the
//! replication stream: the connections on which the other side sent `REPLCONF`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{broadcast, mpsc};
use tokio::time::Instant;

/// A running proxy to `upstream`.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    up: Arc<AtomicBool>,
    delay_ms: Arc<AtomicU64>,
    replication_only: Arc<AtomicBool>,
    cut: broadcast::Sender<()>,
    /// `true` while frozen: nothing is passed on either way, nothing is dropped.
    frozen: Arc<tokio::sync::watch::Sender<bool>>,
    /// What a client sends that stops the replies on its connection ([`Proxy::withhold_reply_to`]).
    withhold: Arc<Mutex<Option<Vec<u8>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Starts a proxy on 127.0.0.1 (a free port) forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let up = Arc::new(AtomicBool::new(true));
        let delay_ms = Arc::new(AtomicU64::new(0));
        let replication_only = Arc::new(AtomicBool::new(false));
        let (cut, _) = broadcast::channel(4);
        let frozen = Arc::new(tokio::sync::watch::Sender::new(false));
        let (up2, cut2, delay2, only2) = (
            up.clone(),
            cut.clone(),
            delay_ms.clone(),
            replication_only.clone(),
        );
        let frozen2 = frozen.clone();
        let withhold: Arc<Mutex<Option<Vec<u8>>>> = Arc::default();
        let withhold2 = withhold.clone();
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                if !up2.load(Ordering::SeqCst) {
                    drop(inbound); // refused while cut
                    continue;
                }
                let mut stop = cut2.subscribe();
                let delay = Delay {
                    ms: delay2.clone(),
                    replication_only: only2.clone(),
                    replication: Arc::new(AtomicBool::new(false)),
                    frozen: frozen2.subscribe(),
                    withhold: withhold2.clone(),
                    withheld: Arc::new(AtomicBool::new(false)),
                };
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (in_r, in_w) = inbound.into_split();
                    let (out_r, out_w) = outbound.into_split();
                    tokio::select! {
                        _ = pump(in_r, out_w, (delay.clone(), true)) => {}
                        _ = pump(out_r, in_w, (delay, false)) => {}
                        _ = stop.recv() => {}
                    }
                });
            }
        });
        Ok(Proxy {
            addr,
            up,
            delay_ms,
            replication_only,
            cut,
            frozen,
            withhold,
            task,
        })
    }

    /// From now on, a connection on which the client sends `pattern` (say, `COMMIT`) passes it
    /// on but gets no reply any more, ever: the server did it, the client never hears.
    pub fn withhold_reply_to(&self, pattern: &[u8]) {
        *self.withhold.lock().unwrap_or_else(PoisonError::into_inner) = Some(pattern.to_vec());
    }

    /// A partition that keeps the connections open: from now on nothing passes either way
    /// (what was read is held, not dropped) until [`Proxy::thaw`]. The other side sees a peer
    /// that went silent, as behind a failed network device.
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// Ends [`Proxy::freeze`]: what was held passes on, in order.
    pub fn thaw(&self) {
        self.frozen.send_replace(false);
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Holds back every byte read from now on for `delay` (each way) before passing it on.
    pub fn delay(&self, delay: Duration) {
        self.delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// From now on, [`Proxy::delay`] holds back only replication streams (connections on which
    /// the client sent `REPLCONF`, as a Redis replica does); every other connection passes at
    /// once.
    pub fn delay_replication_only(&self) {
        self.replication_only.store(true, Ordering::SeqCst);
    }

    /// Drops every open connection, with what the delay still held back, and refuses new ones.
    pub fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        let _ = self.cut.send(());
    }

    /// Accepts connections again.
    pub fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One connection's delay: the proxy's, and whether it applies to this connection.
#[derive(Clone)]
struct Delay {
    ms: Arc<AtomicU64>,
    replication_only: Arc<AtomicBool>,
    /// The client sent `REPLCONF` on this connection: a replica's stream.
    replication: Arc<AtomicBool>,
    /// Whether the proxy is frozen ([`Proxy::freeze`]).
    frozen: tokio::sync::watch::Receiver<bool>,
    /// The proxy's [`Proxy::withhold_reply_to`] pattern.
    withhold: Arc<Mutex<Option<Vec<u8>>>>,
    /// The client sent that pattern on this connection: no more replies.
    withheld: Arc<AtomicBool>,
}

impl Delay {
    fn now(&self) -> Duration {
        if self.replication_only.load(Ordering::SeqCst) && !self.replication.load(Ordering::SeqCst)
        {
            return Duration::ZERO;
        }
        Duration::from_millis(self.ms.load(Ordering::SeqCst))
    }
}

/// Copies `from` to `to`, each chunk no earlier than the delay after it was read; returns when
/// either side closes. `inbound`: `from` is the client's side (where `REPLCONF` is looked for).
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, (delay, inbound): (Delay, bool)) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let mut frozen = delay.frozen.clone();
    let withheld = delay.withheld.clone();
    let read = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if inbound && buf[..n].windows(8).any(|w| w == b"REPLCONF") {
                        delay.replication.store(true, Ordering::SeqCst);
                    }
                    if inbound {
                        let pattern = delay
                            .withhold
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .clone();
                        if let Some(p) = pattern.filter(|p| !p.is_empty())
                            && buf[..n].windows(p.len()).any(|w| w == p.as_slice())
                        {
                            delay.withheld.store(true, Ordering::SeqCst);
                        }
                    }
                    let due = Instant::now() + delay.now();
                    if tx.send((due, buf[..n].to_vec())).is_err() {
                        return;
                    }
                }
            }
        }
    };
    let write = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if frozen.wait_for(|f| !*f).await.is_err() {
                return;
            }
            if !inbound && withheld.load(Ordering::SeqCst) {
                // Held for good: the connection stays open, its replies never arrive.
                std::future::pending::<()>().await;
            }
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
}
