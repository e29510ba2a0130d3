//! Limits that keep one client's requests from starving the others.
//!
//! * CPU work of a request before it reaches the engine — parsing its JSON body, rendering the
//!   chat template, tokenizing — runs on tokio's blocking pool, never on the async threads that
//!   accept connections and answer `/health`; at most `--threads-http` such jobs run at once,
//!   the others wait in a bounded queue (full: 503).
//! * Bytes of request bodies in flight (arriving, waiting or being processed) are bounded by
//!   `--max-pending-bytes`; a body that does not fit is refused with 503 before it is read.
//! * A prompt's text longer than the context could ever hold is refused before it is tokenized:
//!   no token covers more bytes than the vocabulary's longest, so text of more than
//!   `n_ctx × longest` bytes cannot fit.

use crate::error::{ApiError, ErrorKind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Requests that may wait for a worker, per worker.
const QUEUE_PER_WORKER: usize = 16;

pub struct Limits {
    work: Arc<Semaphore>,
    workers: usize,
    waiting: AtomicUsize,
    max_waiting: usize,
    bytes: Arc<Semaphore>,
    max_bytes: usize,
    longest_token: usize,
}

/// Counts a request as waiting for a worker while it exists (a client that goes away while
/// waiting stops counting).
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// 503 `unavailable_error`: the server refuses work it has no room for now; the client may retry.
fn busy(what: String) -> ApiError {
    ApiError::new(
        ErrorKind::Unavailable,
        format!("server busy: {what}; retry later"),
    )
}

impl Limits {
    /// `workers`: CPU jobs at once; `max_bytes`: bytes of request bodies in flight;
    /// `longest_token`: bytes of the vocabulary's longest token text.
    pub fn new(workers: usize, max_bytes: usize, longest_token: usize) -> Self {
        let workers = workers.max(1);
        // A semaphore counts at most u32::MAX permits per acquisition.
        let max_bytes = max_bytes.clamp(1, u32::MAX as usize);
        Limits {
            work: Arc::new(Semaphore::new(workers)),
            workers,
            waiting: AtomicUsize::new(0),
            max_waiting: workers * QUEUE_PER_WORKER,
            bytes: Arc::new(Semaphore::new(max_bytes)),
            max_bytes,
            longest_token: longest_token.max(1),
        }
    }

    /// Most CPU jobs at once.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Most bytes of request bodies in flight.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// Runs `f` on the blocking pool once a worker is free; 503 when the queue is full.
    pub async fn cpu<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let permit = match self.work.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                if self.waiting.fetch_add(1, Ordering::AcqRel) >= self.max_waiting {
                    self.waiting.fetch_sub(1, Ordering::AcqRel);
                    return Err(busy(format!(
                        "{} requests are waiting for the {} request workers (--threads-http)",
                        self.max_waiting, self.workers
                    )));
                }
                let _w = Waiting(&self.waiting);
                self.work
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|_| ApiError::server("the request workers have stopped"))?
            }
        };
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            f()
        })
        .await
        .map_err(|e| ApiError::server(format!("request worker failed: {e}")))?
    }

    /// Reserves `n` bytes of the budget of bodies in flight, held until the permit is dropped;
    /// 503 when the budget has no room for them now.
    pub fn reserve(&self, n: usize) -> Result<OwnedSemaphorePermit, ApiError> {
        let n = n.clamp(1, self.max_bytes) as u32;
        self.bytes.clone().try_acquire_many_owned(n).map_err(|_| {
            busy(format!(
                "request bodies in flight would exceed {} bytes (--max-pending-bytes)",
                self.max_bytes
            ))
        })
    }

    /// Refuses prompt text that cannot fit `n_ctx` tokens whatever it tokenizes to
    /// (llama-server's `exceed_context_size_error`, with the fewest tokens it can have).
    pub fn check_prompt_bytes(&self, bytes: usize, n_ctx: usize) -> Result<(), ApiError> {
        let at_least = bytes.div_ceil(self.longest_token);
        // As the tokenized prompt's own check: it must leave room for a generated token.
        if at_least >= n_ctx {
            let mut e = ApiError::exceed_context(at_least, n_ctx);
            e.message = format!(
                "request (at least {at_least} tokens: {bytes} bytes of text) exceeds the available context size ({n_ctx} tokens), try increasing it"
            );
            return Err(e);
        }
        Ok(())
    }
}

/// Bytes of the longest token text of a vocabulary: as stored (byte-level encodings store each
/// byte as one or two characters, so never shorter than its bytes) or as raw bytes, whichever
/// is longer.
pub fn longest_token(tok: &specd_tokenizer::Tokenizer) -> usize {
    (0..tok.n_vocab() as u32)
        .map(|id| {
            let stored = tok.token_text(id).map_or(0, str::len);
            stored.max(tok.token_to_bytes(id).len())
        })
        .max()
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_bytes_bound() {
        let l = Limits::new(1, 100, 4);
        assert!(l.check_prompt_bytes(36, 10).is_ok());
        let e = l.check_prompt_bytes(37, 10).unwrap_err();
        assert_eq!(e.status().as_u16(), 400);
        assert_eq!(e.extra["n_prompt_tokens"], 10);
    }

    #[test]
    fn byte_budget() {
        let l = Limits::new(1, 100, 1);
        let a = l.reserve(60).unwrap();
        assert!(l.reserve(60).is_err());
        drop(a);
        assert!(l.reserve(60).is_ok());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queue_is_bounded() {
        let l = Arc::new(Limits::new(1, 100, 1));
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let rx = Arc::new(std::sync::Mutex::new(rx));
        // One job holds the worker; QUEUE_PER_WORKER wait; the next is refused.
        let mut held = Vec::new();
        for _ in 0..=QUEUE_PER_WORKER {
            let (l, rx) = (l.clone(), rx.clone());
            held.push(tokio::spawn(async move {
                l.cpu(move || {
                    let _ = rx.lock().map(|r| r.recv());
                    Ok(())
                })
                .await
            }));
        }
        while l.waiting.load(Ordering::Acquire) < QUEUE_PER_WORKER {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let e = l.cpu(|| Ok(())).await.unwrap_err();
        assert_eq!(e.status().as_u16(), 503);
        for _ in 0..=QUEUE_PER_WORKER {
            let _ = tx.send(());
        }
        for h in held {
            assert!(h.await.unwrap().is_ok());
        }
    }
}
