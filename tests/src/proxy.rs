//! A TCP proxy that a test can cut and restore, to play a database outage without stopping the
//! shared server (other tests use it at the same time), and delay, to play a slow link (a
//! replication stream that lags). Cutting drops what is still held back by the delay: those
//! bytes never arrive, as on a link that failed.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{broadcast, mpsc};
use tokio::time::Instant;

/// A running proxy to `upstream`.
pub struct Proxy {
    addr: SocketAddr,
    up: Arc<AtomicBool>,
    delay_ms: Arc<AtomicU64>,
    cut: broadcast::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Starts a proxy on 127.0.0.1 (a free port) forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let up = Arc::new(AtomicBool::new(true));
        let delay_ms = Arc::new(AtomicU64::new(0));
        let (cut, _) = broadcast::channel(4);
        let (up2, cut2, delay2) = (up.clone(), cut.clone(), delay_ms.clone());
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                if !up2.load(Ordering::SeqCst) {
                    drop(inbound); // refused while cut
                    continue;
                }
                let mut stop = cut2.subscribe();
                let delay = delay2.clone();
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (in_r, in_w) = inbound.into_split();
                    let (out_r, out_w) = outbound.into_split();
                    tokio::select! {
                        _ = pump(in_r, out_w, delay.clone()) => {}
                        _ = pump(out_r, in_w, delay) => {}
                        _ = stop.recv() => {}
                    }
                });
            }
        });
        Ok(Proxy {
            addr,
            up,
            delay_ms,
            cut,
            task,
        })
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

/// Copies `from` to `to`, each chunk no earlier than the delay after it was read; returns when
/// either side closes.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, delay_ms: Arc<AtomicU64>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let read = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    let due =
                        Instant::now() + Duration::from_millis(delay_ms.load(Ordering::SeqCst));
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
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
}
