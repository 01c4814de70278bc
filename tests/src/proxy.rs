//! A TCP proxy that a test can cut and restore, to play a database outage without stopping the
//! shared server (other tests use it at the same time).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::broadcast;

/// A running proxy to `upstream`.
pub struct Proxy {
    addr: SocketAddr,
    up: Arc<AtomicBool>,
    cut: broadcast::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Starts a proxy on 127.0.0.1 (a free port) forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let up = Arc::new(AtomicBool::new(true));
        let (cut, _) = broadcast::channel(4);
        let (up2, cut2) = (up.clone(), cut.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !up2.load(Ordering::SeqCst) {
                    drop(inbound); // refused while cut
                    continue;
                }
                let mut stop = cut2.subscribe();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = stop.recv() => {}
                    }
                });
            }
        });
        Ok(Proxy {
            addr,
            up,
            cut,
            task,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Drops every open connection and refuses new ones.
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
