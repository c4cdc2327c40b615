//! The stdio transport, with one addition the SDK's lacks: it notices when the client has gone
//! (end of stdin), so a call still waiting can give back what it took instead of answering
//! nobody.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};

/// Set once stdin reached its end: the client closed it or exited.
#[derive(Debug, Clone, Default)]
pub struct ClientGone(Arc<AtomicBool>);

impl ClientGone {
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Stdin that sets [`ClientGone`] at its end.
pub struct WatchedStdin {
    inner: tokio::io::Stdin,
    gone: ClientGone,
}

/// The transport pair for `serve`, and the flag its reader sets.
pub fn stdio() -> ((WatchedStdin, tokio::io::Stdout), ClientGone) {
    let gone = ClientGone::default();
    let reader = WatchedStdin {
        inner: tokio::io::stdin(),
        gone: gone.clone(),
    };
    ((reader, tokio::io::stdout()), gone)
}

impl AsyncRead for WatchedStdin {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(result) = &polled {
            // A ready read that added nothing to a buffer with room is the end of the stream.
            let at_end = result.is_err() || buf.filled().len() == before;
            if at_end && buf.remaining() > 0 {
                self.gone.0.store(true, Ordering::Relaxed);
            }
        }
        polled
    }
}
