//! A TCP proxy a test can cut: every connection through it is closed at
//! once, and new ones are refused until it is mended. Nodes that advertise
//! a proxy's address lose their link when it is cut.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

pub struct TcpProxy {
    pub port: u16,
    open: Arc<AtomicBool>,
    links: Arc<tokio::sync::Mutex<JoinSet<()>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl TcpProxy {
    /// Forwards a free loopback port to `127.0.0.1:target`.
    pub async fn start(target: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let open = Arc::new(AtomicBool::new(true));
        let links = Arc::new(tokio::sync::Mutex::new(JoinSet::new()));
        let accept = tokio::spawn({
            let (open, links) = (open.clone(), links.clone());
            async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    if !open.load(Ordering::SeqCst) {
                        continue;
                    }
                    links.lock().await.spawn(async move {
                        if let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", target)).await {
                            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                    });
                }
            }
        });
        Self { port, open, links, accept }
    }

    /// Closes every connection and refuses new ones; how many it closed.
    pub async fn cut(&self) -> usize {
        self.open.store(false, Ordering::SeqCst);
        let mut links = self.links.lock().await;
        let cut = links.len();
        links.abort_all();
        while links.join_next().await.is_some() {}
        cut
    }

    /// Accepts connections again.
    pub fn mend(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}
