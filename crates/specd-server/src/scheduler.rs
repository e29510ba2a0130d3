//! The engine thread: owns the [`Engine`], runs every busy slot's round in one
//! [`Engine::step`] (continuous batching: new requests join between steps), queues requests FIFO
//! while every slot is busy, and cancels a slot as soon as its client has gone.
//!
//! HTTP handlers submit a [`Job`] through an mpsc channel and receive [`Event`]s on the job's
//! own channel. With `--sleep-idle-seconds`, the thread drops the engine (all sequence memory)
//! after that long without work and starts a new one for the next job or [`Scheduler::wake`]. What `/slots` and `/metrics` show is published after every step into a
//! [`Shared`] snapshot, so those endpoints never wait for a step to end.

use crate::error::{ApiError, ErrorKind};
use crate::metrics::Timings;
use serde_json::Value;
use specd_backend::Backend;
use specd_backend::{KvType, MemoryConfig, MemoryUsage, SeqId};
use specd_spec::engine::TokenProbs;
use specd_spec::{
    Engine, FinishReason, LiveTimings, PromptProgress, RamCacheStats, RollbackKind, SeqOutput,
    SequenceRequest, SpecError, SpecStats, StepEvent,
};
use std::collections::{BTreeMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// A generation request on its way to the engine thread.
pub struct Job {
    pub req: SequenceRequest,
    /// A specific slot, or the best free one.
    pub id_slot: Option<usize>,
    /// Where this job's events go; dropping the receiver cancels the job.
    pub events: mpsc::UnboundedSender<Event>,
    /// The request's generation settings as shown by `/slots`.
    pub settings: Value,
    /// Send [`Event::Progress`] while the prompt is processed (`return_progress`).
    pub progress: bool,
    /// Attach the timings so far to each [`Event::Chunk`] (`timings_per_token`).
    pub timings: bool,
}

/// Prompt reuse settings of the engine.
#[derive(Debug, Clone, Copy, Default)]
pub struct PromptCache {
    /// Prompt-end checkpoints kept per slot (`--ctx-checkpoints`).
    pub checkpoints: usize,
    /// Bytes of the prompt cache in RAM (`--cache-ram`; 0: off).
    pub ram_bytes: usize,
    /// llama-server's `--cache-idle-slots` with a unified memory (`--kv-unified`, where a slot
    /// may grow to the whole context): when a request starts on a slot, every other idle slot's
    /// memory is saved into the prompt cache in RAM and freed, so the memory conversations hold
    /// between their turns is bounded by `--cache-ram`, not by slots × context. A conversation
    /// whose slot was freed continues from the cache, token for token the same. With per-slot
    /// memory llama-server only copies idle slots into its cache; specd does not, since it
    /// saves a slot's memory anyway at the moment another conversation takes the slot.
    pub free_idle_slots: bool,
}

/// A saved slot: the tokens it kept and its memory as bytes.
pub type SavedSlot = (Vec<u32>, Vec<u8>);

/// A slot action (llama-server's `POST /slots/{id}?action=…`), run by the engine thread once
/// the slot is idle (it waits while the slot generates, as in llama-server).
pub enum SlotTask {
    /// The slot's kept tokens and its memory as bytes (empty if kept for another cache
    /// scope than `scope`).
    Save {
        slot: usize,
        scope: u64,
        reply: oneshot::Sender<Result<SavedSlot, ApiError>>,
    },
    /// Makes the slot hold `tokens` with the saved memory `state`, for reuse by `scope`.
    Restore {
        slot: usize,
        scope: u64,
        tokens: Vec<u32>,
        state: Vec<u8>,
        reply: oneshot::Sender<Result<(), ApiError>>,
    },
    /// Frees the slot's kept memory; replies with the number of tokens it held.
    Erase {
        slot: usize,
        reply: oneshot::Sender<Result<usize, ApiError>>,
    },
}

impl SlotTask {
    fn slot(&self) -> usize {
        match self {
            SlotTask::Save { slot, .. }
            | SlotTask::Restore { slot, .. }
            | SlotTask::Erase { slot, .. } => *slot,
        }
    }
}

/// What the engine thread receives.
enum Msg {
    Job(Box<Job>),
    Slot(SlotTask),
    /// Leave the sleeping state; answered once awake.
    Wake(oneshot::Sender<()>),
    /// Drop every slot's kept memory (see [`Scheduler::flush`]).
    Flush(oneshot::Sender<Flushed>),
}

/// What a cache flush did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flushed {
    /// Every slot's kept memory was dropped: this many slots held this many tokens.
    Done { slots: usize, tokens: usize },
    /// Requests were running or waiting (this many): nothing was dropped.
    Busy(usize),
}

/// What the engine thread tells a job.
#[derive(Debug)]
pub enum Event {
    /// The job got a slot and its prompt will be processed at the next step.
    Started { slot: usize, id_task: u64 },
    /// How far the prompt has been processed (jobs that asked for it).
    Progress(PromptProgress),
    /// New tokens, their text (complete UTF-8, stop strings held back) and, when asked for,
    /// their log-probabilities and the timings so far.
    Chunk {
        tokens: Vec<u32>,
        text: String,
        probs: Vec<TokenProbs>,
        timings: Option<Box<LiveTimings>>,
    },
    /// The generation ended.
    Done(Box<SeqOutput>),
    /// The job failed (before or after starting).
    Failed(ApiError),
}

/// Server-wide counters (the `/metrics` content).
#[derive(Debug, Clone, Default)]
pub struct Totals {
    /// Prompt tokens processed (reused ones excluded) and their time, in microseconds (see
    /// [`crate::metrics::Timings`]).
    pub prompt_tokens: u64,
    pub prompt_us: u64,
    /// Generated tokens, the decode steps they cost (the first token of a request costs none:
    /// it comes from the prompt's last row) and the time of those steps, in microseconds.
    pub predicted_tokens: u64,
    pub predicted_steps: u64,
    pub predicted_us: u64,
    /// Engine steps (each is one batched decode of all busy slots' rows, plus a prompt batch
    /// when new requests joined).
    pub steps: u64,
    /// Sum over steps of the busy slots (average = this / steps).
    pub busy_slot_steps: u64,
    /// Most positions one sequence held.
    pub n_tokens_max: u64,
    /// Prompt tokens taken from kept memory.
    pub cached_prompt_tokens: u64,
    pub requests_finished: u64,
    pub requests_failed: u64,
    /// Jobs dropped because their client disconnected.
    pub requests_cancelled: u64,
    /// Engine panics recovered from.
    pub engine_restarts: u64,
    /// Speculation counters of all finished requests.
    pub spec: SpecStats,
}

/// One slot as `/slots` shows it.
#[derive(Debug, Clone, Default)]
pub struct SlotView {
    pub id: usize,
    /// The running task, else the slot's last one (None: the slot never had a task).
    pub id_task: Option<u64>,
    pub processing: bool,
    /// That task's generation settings.
    pub settings: Value,
    /// Tokens the slot holds in memory (prompt and generated), running or kept for reuse.
    pub n_tokens: usize,
    /// The running task's prompt tokens processed and reused from memory (0 when idle).
    pub n_prompt_processed: usize,
    pub n_prompt_cached: usize,
    /// Tokens the running task generated (0 when idle).
    pub n_decoded: usize,
    /// Tokens the running task may still generate (None: idle, or no limit but the context).
    pub n_remain: Option<usize>,
    pub has_new_line: bool,
}

/// What the engine thread publishes after each step.
#[derive(Debug, Clone, Default)]
pub struct Shared {
    pub slots: Vec<SlotView>,
    /// Requests waiting for a slot, and their prompt tokens.
    pub deferred: usize,
    pub deferred_tokens: usize,
    pub totals: Totals,
    pub memory: MemoryUsage,
    /// The prompt cache in RAM.
    pub ram_cache: RamCacheStats,
    /// The engine is released after `--sleep-idle-seconds` without work. The rest of the
    /// snapshot stays as it was on entering sleep.
    pub sleeping: bool,
}

/// Handle of the engine thread held by the HTTP side.
#[derive(Clone)]
pub struct Scheduler {
    tx: mpsc::UnboundedSender<Msg>,
    shared: Arc<Mutex<Shared>>,
}

impl Scheduler {
    /// Starts the engine thread over a memory of `mem_cfg` (one sequence per slot); `cache`:
    /// prompt reuse settings; `sleep_idle`: release the engine after that long without work.
    pub fn start(
        model: Arc<dyn Backend>,
        mem_cfg: MemoryConfig,
        rollback: RollbackKind,
        cache: PromptCache,
        sleep_idle: Option<Duration>,
    ) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::unbounded_channel();
        let n_slots = mem_cfg.max_seqs;
        let shared = Arc::new(Mutex::new(Shared {
            slots: (0..n_slots)
                .map(|id| SlotView {
                    id,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }));
        let engine = new_engine(&model, &mem_cfg, rollback, cache)
            .map_err(|e| std::io::Error::other(format!("starting the engine: {e}")))?;
        let worker = Worker {
            model,
            mem_cfg,
            rollback,
            cache,
            sleep_idle,
            engine: Some(engine),
            rx,
            queue: VecDeque::new(),
            slot_tasks: VecDeque::new(),
            active: BTreeMap::new(),
            last_used: vec![0; n_slots],
            tasks: vec![None; n_slots],
            settings: vec![Value::Null; n_slots],
            clock: 0,
            next_task: 0,
            totals: Totals::default(),
            shared: shared.clone(),
            outbox: Vec::new(),
        };
        std::thread::Builder::new()
            .name("specd-engine".into())
            .spawn(move || worker.run())?;
        Ok(Scheduler { tx, shared })
    }

    /// Queues a job. Fails only if the engine thread is gone.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        self.tx
            .send(Msg::Job(Box::new(job)))
            .map_err(|_| ApiError::new(ErrorKind::Unavailable, "the engine thread has stopped"))
    }

    /// Queues a slot action. Fails only if the engine thread is gone.
    pub fn slot_task(&self, task: SlotTask) -> Result<(), ApiError> {
        self.tx
            .send(Msg::Slot(task))
            .map_err(|_| ApiError::new(ErrorKind::Unavailable, "the engine thread has stopped"))
    }

    /// Leaves the sleeping state (a new engine), returning once awake; at once if awake.
    pub async fn wake(&self) {
        let sleeping = match self.shared.lock() {
            Ok(s) => s.sleeping,
            Err(p) => p.into_inner().sleeping,
        };
        if !sleeping {
            return;
        }
        let (done, awake) = oneshot::channel();
        if self.tx.send(Msg::Wake(done)).is_ok() {
            let _ = awake.await;
        }
    }

    /// Drops every slot's kept memory (prompt reuse starts over), as SGLang's `/flush_cache`
    /// does: only while no request runs or waits, so no generation loses its memory.
    pub async fn flush(&self) -> Result<Flushed, ApiError> {
        let (reply, done) = oneshot::channel();
        let gone = || ApiError::new(ErrorKind::Unavailable, "the engine thread has stopped");
        self.tx.send(Msg::Flush(reply)).map_err(|_| gone())?;
        done.await.map_err(|_| gone())
    }

    /// True while the engine thread runs.
    pub fn alive(&self) -> bool {
        !self.tx.is_closed()
    }

    /// The latest published state.
    pub fn snapshot(&self) -> Shared {
        match self.shared.lock() {
            Ok(s) => s.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }
}

struct Active {
    events: mpsc::UnboundedSender<Event>,
    progress: bool,
    timings: bool,
    /// Bytes of text and number of log-probabilities already sent.
    sent_text: usize,
    sent_probs: usize,
    want_probs: bool,
    n_prompt: usize,
    /// Prompt tokens reused from the slot's memory.
    n_cached: usize,
    n_decoded: usize,
    /// The request's own limit (`n_predict`; None: only the context bounds it).
    n_predict: Option<usize>,
    has_new_line: bool,
}

struct Worker {
    model: Arc<dyn Backend>,
    mem_cfg: MemoryConfig,
    rollback: RollbackKind,
    cache: PromptCache,
    sleep_idle: Option<Duration>,
    /// None while sleeping.
    engine: Option<Engine>,
    rx: mpsc::UnboundedReceiver<Msg>,
    queue: VecDeque<Job>,
    /// Slot actions waiting for their slot to be idle.
    slot_tasks: VecDeque<SlotTask>,
    active: BTreeMap<usize, Active>,
    /// Per slot: when it was last given a job (least recently used goes first).
    last_used: Vec<u64>,
    /// Per slot: its running or last task and that task's settings.
    tasks: Vec<Option<u64>>,
    settings: Vec<Value>,
    clock: u64,
    next_task: u64,
    totals: Totals,
    shared: Arc<Mutex<Shared>>,
    /// Events held until the state they follow from is published, so a client that got its
    /// answer never sees `/slots` or `/metrics` from before it.
    outbox: Vec<(mpsc::UnboundedSender<Event>, Event)>,
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".into()
    }
}

fn new_engine(
    model: &Arc<dyn Backend>,
    mem_cfg: &MemoryConfig,
    rollback: RollbackKind,
    cache: PromptCache,
) -> Result<Engine, specd_spec::SpecError> {
    let mut engine = Engine::new(model.clone(), mem_cfg.clone(), rollback)?;
    engine.set_prompt_cache(true, cache.checkpoints);
    engine.set_ram_cache(cache.ram_bytes);
    Ok(engine)
}

/// The engine started again (after a sleep or a panic) with the settings it started with at
/// launch. If the backend now refuses them (a lost device), the server cannot serve anyone:
/// it says why and exits.
fn restart_engine(
    model: &Arc<dyn Backend>,
    mem_cfg: &MemoryConfig,
    rollback: RollbackKind,
    cache: PromptCache,
) -> Engine {
    match new_engine(model, mem_cfg, rollback, cache) {
        Ok(e) => e,
        Err(e) => {
            tracing::error!("cannot start the engine again: {e}");
            eprintln!("specd: cannot start the engine again: {e}");
            std::process::exit(1)
        }
    }
}

impl Worker {
    fn run(mut self) {
        // Times the idle wait before sleeping (the channel is tokio's).
        let timer = match self.sleep_idle {
            Some(_) => tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .ok(),
            None => None,
        };
        loop {
            if self.active.is_empty() && self.queue.is_empty() {
                self.publish();
                self.flush();
                match self.wait_idle(timer.as_ref()) {
                    Some(msg) => self.take(msg),
                    None => return, // the server is gone
                }
            }
            while let Ok(msg) = self.rx.try_recv() {
                self.take(msg);
            }
            self.reap_cancelled();
            self.run_slot_tasks();
            self.admit();
            if self.active.is_empty() || !self.outbox.is_empty() {
                // New jobs hear they started before any progress of their prompt.
                self.publish();
                self.flush();
                if self.active.is_empty() {
                    continue;
                }
            }
            let busy = self.active.len() as u64;
            self.engine(); // started again if it slept
            let (Some(engine), active) = (self.engine.as_mut(), &self.active) else {
                continue;
            };
            // Progress goes out at once, while the step still runs.
            let mut progress = |p: PromptProgress| {
                if let Some(a) = active.get(&(p.seq as usize)).filter(|a| a.progress) {
                    let _ = a.events.send(Event::Progress(p));
                }
            };
            // A client that has gone stops its prompt at the next chunk (reaped above next time).
            let gone = |seq: SeqId| {
                active
                    .get(&(seq as usize))
                    .is_some_and(|a| a.events.is_closed())
            };
            match catch_unwind(AssertUnwindSafe(|| engine.step_with(&mut progress, &gone))) {
                Ok(events) => {
                    self.totals.steps += 1;
                    self.totals.busy_slot_steps += busy;
                    self.dispatch(events);
                }
                Err(p) => self.recover(&panic_message(p.as_ref())),
            }
            self.publish();
            self.flush();
        }
    }

    /// Runs the slot actions whose slot is idle (the others wait), before queued jobs are
    /// admitted, so a restore lands before a request that was sent after it.
    fn run_slot_tasks(&mut self) {
        let n_slots = self.last_used.len();
        let mut waiting = VecDeque::new();
        while let Some(task) = self.slot_tasks.pop_front() {
            let slot = task.slot();
            if slot < n_slots && self.active.contains_key(&slot) {
                waiting.push_back(task);
                continue;
            }
            let bad = || ApiError::invalid("Invalid slot ID");
            let seq = slot as SeqId;
            match task {
                SlotTask::Save { scope, reply, .. } => {
                    let r = if slot >= n_slots {
                        Err(bad())
                    } else {
                        self.engine()
                            .save_kept(seq, scope)
                            .map_err(|e| ApiError::server(format!("Unable to save slot: {e}")))
                    };
                    let _ = reply.send(r);
                }
                SlotTask::Restore {
                    scope,
                    tokens,
                    state,
                    reply,
                    ..
                } => {
                    let r = if slot >= n_slots {
                        Err(bad())
                    } else {
                        self.engine()
                            .restore_kept(seq, scope, tokens, &state)
                            .map_err(|e| ApiError::invalid(format!("Unable to restore slot: {e}")))
                    };
                    let _ = reply.send(r);
                }
                SlotTask::Erase { reply, .. } => {
                    let r = if slot >= n_slots {
                        Err(bad())
                    } else {
                        let e = self.engine();
                        let n = e.cached_tokens(seq).map_or(0, <[u32]>::len);
                        e.forget(seq);
                        Ok(n)
                    };
                    let _ = reply.send(r);
                }
            }
        }
        self.slot_tasks = waiting;
    }

    /// The next message while idle. After `sleep_idle` without one, the engine is dropped
    /// (sleep) and the wait goes on; the message that ends it wakes the engine.
    fn wait_idle(&mut self, timer: Option<&tokio::runtime::Runtime>) -> Option<Msg> {
        if let (Some(idle), Some(timer), Some(_)) = (self.sleep_idle, timer, &self.engine) {
            // The timeout is made inside block_on: its timer needs the runtime.
            let rx = &mut self.rx;
            match timer.block_on(async { tokio::time::timeout(idle, rx.recv()).await }) {
                Ok(msg) => return msg,
                Err(_) => self.sleep(),
            }
        }
        let msg = self.rx.blocking_recv();
        if msg.is_some() && self.engine.is_none() {
            self.engine();
            tracing::info!("woke up: engine started again");
            self.set_sleeping(false);
        }
        msg
    }

    fn take(&mut self, msg: Msg) {
        match msg {
            Msg::Job(job) => self.queue.push_back(*job),
            Msg::Slot(task) => self.slot_tasks.push_back(task),
            Msg::Wake(done) => {
                let _ = done.send(());
            }
            Msg::Flush(reply) => {
                let _ = reply.send(self.flush_kept());
            }
        }
    }

    /// Forgets every slot's kept memory and the RAM cache, unless a request runs or waits.
    fn flush_kept(&mut self) -> Flushed {
        let busy = self.active.len() + self.queue.len();
        if busy > 0 {
            return Flushed::Busy(busy);
        }
        let (mut slots, mut tokens) = (0, 0);
        if let Some(e) = self.engine.as_mut() {
            for s in 0..self.last_used.len() {
                let n = e.cached_tokens(s as SeqId).map_or(0, <[u32]>::len);
                if n > 0 {
                    slots += 1;
                    tokens += n;
                }
            }
            // Slots' kept memory and the prompt cache in RAM alike.
            e.clear_prompt_cache();
        }
        tracing::info!(slots, tokens, "cache flushed");
        Flushed::Done { slots, tokens }
    }

    /// Releases the engine: every sequence's memory and the kept prompts. `/metrics` and
    /// `/slots` keep showing the snapshot taken before.
    fn sleep(&mut self) {
        self.engine = None;
        self.set_sleeping(true);
        tracing::info!("idle: sleeping (engine released)");
    }

    fn set_sleeping(&self, sleeping: bool) {
        match self.shared.lock() {
            Ok(mut s) => s.sleeping = sleeping,
            Err(p) => p.into_inner().sleeping = sleeping,
        }
    }

    /// The engine, started again after a sleep.
    fn engine(&mut self) -> &mut Engine {
        self.engine.get_or_insert_with(|| {
            restart_engine(&self.model, &self.mem_cfg, self.rollback, self.cache)
        })
    }

    fn send(&mut self, to: &mpsc::UnboundedSender<Event>, ev: Event) {
        self.outbox.push((to.clone(), ev));
    }

    /// Delivers held events (a client that has gone is simply skipped).
    fn flush(&mut self) {
        for (to, ev) in self.outbox.drain(..) {
            let _ = to.send(ev);
        }
    }

    /// Drops jobs and slots whose client has gone; their memory is freed at once.
    fn reap_cancelled(&mut self) {
        let gone: Vec<usize> = self
            .active
            .iter()
            .filter(|(_, a)| a.events.is_closed())
            .map(|(s, _)| *s)
            .collect();
        for slot in gone {
            self.engine().cancel(slot as SeqId);
            self.active.remove(&slot);
            self.totals.requests_cancelled += 1;
            tracing::info!(slot, "client disconnected: slot cancelled");
        }
        let before = self.queue.len();
        self.queue.retain(|j| !j.events.is_closed());
        self.totals.requests_cancelled += (before - self.queue.len()) as u64;
    }

    /// Gives queued jobs free slots, in arrival order.
    fn admit(&mut self) {
        let n_slots = self.last_used.len();
        let mut i = 0;
        while i < self.queue.len() && self.active.len() < n_slots {
            let slot = match self.queue[i].id_slot {
                Some(s) if s >= n_slots => {
                    if let Some(job) = self.queue.remove(i) {
                        self.send(
                            &job.events,
                            Event::Failed(ApiError::invalid(format!(
                                "id_slot {s} does not exist (the server has {n_slots} slots)"
                            ))),
                        );
                        self.totals.requests_failed += 1;
                    }
                    continue;
                }
                Some(s) if self.active.contains_key(&s) => {
                    i += 1; // wait for that slot; later jobs may go first
                    continue;
                }
                Some(s) => s,
                None => self.pick_slot(&self.queue[i]),
            };
            let Some(job) = self.queue.remove(i) else {
                break;
            };
            self.start(slot, job);
        }
    }

    /// The free slot for a job: the one whose kept memory serves most of its prompt (what can
    /// really be reused: a hybrid model's recurrent state only at its end, within its rollback
    /// record or at a checkpoint — a longer common token prefix alone is no reason to take a
    /// slot and destroy its conversation); else a slot that keeps nothing; else the least
    /// recently used one, whose memory the engine saves to the prompt cache in RAM.
    fn pick_slot(&self, job: &Job) -> usize {
        let free = (0..self.last_used.len()).filter(|s| !self.active.contains_key(s));
        let key = |s: usize| {
            let seq = s as SeqId;
            let (usable, empty) = match &self.engine {
                Some(e) if job.req.cache_prompt => (
                    e.reusable_prefix(seq, job.req.cache_scope, &job.req.prompt),
                    e.cached_tokens(seq).is_none_or(<[u32]>::is_empty),
                ),
                Some(e) => (0, e.cached_tokens(seq).is_none_or(<[u32]>::is_empty)),
                None => (0, true),
            };
            (usable, empty, std::cmp::Reverse(self.last_used[s]))
        };
        free.max_by_key(|&s| (key(s), std::cmp::Reverse(s)))
            .unwrap_or(0)
    }

    fn start(&mut self, slot: usize, job: Job) {
        if job.req.prompt.is_empty() {
            // llama-server answers an empty prompt at once, with nothing generated.
            let id_task = self.next_task;
            self.next_task += 1;
            self.send(&job.events, Event::Started { slot, id_task });
            let out = SeqOutput {
                tokens: Vec::new(),
                text: String::new(),
                reason: FinishReason::Error,
                stop_word: None,
                n_prompt: 0,
                n_cached: 0,
                prompt_secs: 0.0,
                gen_secs: 0.0,
                first_token_secs: 0.0,
                decode_secs: 0.0,
                stats: SpecStats::default(),
                probs: Vec::new(),
                prompt_probs: Vec::new(),
                eog: None,
            };
            self.send(&job.events, Event::Done(Box::new(out)));
            self.totals.requests_finished += 1;
            return;
        }
        let n_prompt = job.req.prompt.len();
        // The request's limit as it asked (the engine's n_predict is bounded by the context
        // when the request set none).
        let n_predict = job
            .settings
            .get("n_predict")
            .and_then(Value::as_u64)
            .map(|n| n as usize);
        let want_probs = job.req.n_probs > 0;
        let ram_before = self.engine().ram_cache_stats();
        let res = catch_unwind(AssertUnwindSafe(|| {
            self.engine().add(slot as SeqId, job.req)
        }));
        let err = match res {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(match e {
                SpecError::Invalid(_) | SpecError::Sampling(_) => ApiError::invalid(e.to_string()),
                other => ApiError::server(other.to_string()),
            }),
            Err(p) => {
                let msg = panic_message(p.as_ref());
                self.recover(&msg);
                Some(ApiError::server(format!("engine panicked: {msg}")))
            }
        };
        if let Some(e) = err {
            self.send(&job.events, Event::Failed(e));
            self.totals.requests_failed += 1;
            return;
        }
        self.clock += 1;
        self.last_used[slot] = self.clock;
        let id_task = self.next_task;
        self.next_task += 1;
        self.send(&job.events, Event::Started { slot, id_task });
        self.tasks[slot] = Some(id_task);
        self.settings[slot] = job.settings;
        let n_cached = self.engine().n_cached(slot as SeqId).unwrap_or(0);
        let ram = self.engine().ram_cache_stats();
        if ram.saves > ram_before.saves || ram.hits > ram_before.hits {
            // llama-server's debug log names this step so ("updating prompt cache").
            tracing::debug!(
                slot,
                n_cached,
                saved = ram.saves - ram_before.saves,
                restored = ram.hits - ram_before.hits,
                "updating prompt cache: the slot's memory and the prompt cache in RAM"
            );
        }
        self.active.insert(
            slot,
            Active {
                events: job.events,
                progress: job.progress,
                timings: job.timings,
                sent_text: 0,
                sent_probs: 0,
                want_probs,
                n_prompt,
                n_cached,
                n_decoded: 0,
                n_predict,
                has_new_line: false,
            },
        );
        self.free_idle_slots(slot);
    }

    /// `--cache-idle-slots` (see [`PromptCache::free_idle_slots`]) once a request has started
    /// on `started`.
    fn free_idle_slots(&mut self, started: usize) {
        if !self.cache.free_idle_slots {
            return;
        }
        for slot in 0..self.last_used.len() {
            if slot == started || self.active.contains_key(&slot) {
                continue;
            }
            if self.engine().cache_idle(slot as SeqId) {
                // The tag is llama-server's (its debug log line for this step, which its
                // server tests look for).
                tracing::debug!(
                    slot,
                    "idle slot saved to the prompt cache in RAM and freed __TEST_TAG_CACHE_IDLE_SLOT__"
                );
            }
        }
    }

    fn dispatch(&mut self, events: Vec<StepEvent>) {
        // Log-probabilities of a sequence that finished in this step are in its output.
        let mut outputs: BTreeMap<SeqId, Box<SeqOutput>> = BTreeMap::new();
        let mut order = Vec::with_capacity(events.len());
        for ev in events {
            match ev {
                StepEvent::Finished { seq, output } => {
                    outputs.insert(seq, output);
                    order.push((seq, None, None));
                }
                StepEvent::Tokens { seq, tokens, text } => {
                    order.push((seq, Some((tokens, text)), None));
                }
                StepEvent::Failed { seq, error } => order.push((seq, None, Some(error))),
            }
        }
        for (seq, tokens, error) in order {
            let slot = seq as usize;
            if let Some((tokens, text)) = tokens {
                let probs_src = self
                    .engine
                    .as_ref()
                    .and_then(|e| e.token_probs(seq))
                    .or_else(|| outputs.get(&seq).map(|o| o.probs.as_slice()));
                let Some(a) = self.active.get_mut(&slot) else {
                    continue;
                };
                let probs = if a.want_probs {
                    let p = probs_src.unwrap_or(&[]);
                    let from = a.sent_probs.min(p.len());
                    let to = (from + tokens.len()).min(p.len());
                    p[from..to].to_vec()
                } else {
                    Vec::new()
                };
                a.sent_probs += probs.len();
                a.sent_text += text.len();
                a.n_decoded += tokens.len();
                a.has_new_line |= text.contains('\n');
                let to = a.events.clone();
                let timings = if a.timings {
                    self.engine
                        .as_ref()
                        .and_then(|e| e.live_timings(seq))
                        .or_else(|| outputs.get(&seq).map(|o| o.timings()))
                        .map(Box::new)
                } else {
                    None
                };
                self.send(
                    &to,
                    Event::Chunk {
                        tokens,
                        text,
                        probs,
                        timings,
                    },
                );
                let held = self
                    .engine
                    .as_ref()
                    .map_or(0, |e| e.memory().n_past(seq) as u64);
                self.totals.n_tokens_max = self.totals.n_tokens_max.max(held);
            } else if let Some(error) = error {
                if let Some(a) = self.active.remove(&slot) {
                    tracing::warn!(slot, %error, "generation failed");
                    self.send(&a.events, Event::Failed(ApiError::of_step(error)));
                    self.totals.requests_failed += 1;
                }
            } else if let Some(out) = outputs.remove(&seq) {
                let Some(a) = self.active.remove(&slot) else {
                    continue;
                };
                // Text held back for a possible stop string that never came (e.g. the context
                // filled up) and log-probabilities not sent yet.
                let tail = out.text.get(a.sent_text..).unwrap_or("").to_string();
                let rest = if a.want_probs {
                    out.probs.get(a.sent_probs..).unwrap_or(&[]).to_vec()
                } else {
                    Vec::new()
                };
                if !tail.is_empty() || !rest.is_empty() {
                    self.send(
                        &a.events,
                        Event::Chunk {
                            tokens: Vec::new(),
                            text: tail,
                            probs: rest,
                            timings: None,
                        },
                    );
                }
                let t = &mut self.totals;
                let tm = Timings::of(&out);
                t.prompt_tokens += tm.prompt_n as u64;
                t.cached_prompt_tokens += tm.cache_n as u64;
                t.prompt_us += tm.prompt_us;
                t.predicted_tokens += tm.predicted_n as u64;
                t.predicted_steps += tm.steps() as u64;
                t.predicted_us += tm.predicted_us;
                t.spec.merge(&out.stats);
                t.requests_finished += 1;
                self.send(&a.events, Event::Done(out));
            }
        }
    }

    /// After an engine panic: fails the running jobs and starts over with a fresh engine, so
    /// one bad request cannot take the server down.
    fn recover(&mut self, msg: &str) {
        tracing::error!("engine panicked: {msg}; failing running requests and restarting it");
        for (_, a) in std::mem::take(&mut self.active) {
            self.send(
                &a.events,
                Event::Failed(ApiError::server(format!("engine panicked: {msg}"))),
            );
            self.totals.requests_failed += 1;
        }
        self.engine = Some(restart_engine(
            &self.model,
            &self.mem_cfg,
            self.rollback,
            self.cache,
        ));
        self.totals.engine_restarts += 1;
    }

    fn publish(&self) {
        let mut sh = match self.shared.lock() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        };
        for (i, v) in sh.slots.iter_mut().enumerate() {
            let a = self.active.get(&i);
            v.processing = a.is_some();
            v.id_task = self.tasks[i];
            v.settings = self.settings[i].clone();
            // A finished task's counters do not stay on its idle slot (llama-server resets
            // them when a slot is released).
            v.n_prompt_processed = a.map_or(0, |a| a.n_prompt - a.n_cached);
            v.n_prompt_cached = a.map_or(0, |a| a.n_cached);
            v.n_decoded = a.map_or(0, |a| a.n_decoded);
            v.n_remain = a.and_then(|a| a.n_predict.map(|n| n.saturating_sub(a.n_decoded)));
            v.has_new_line = a.is_some_and(|a| a.has_new_line);
            v.n_tokens = match (&self.engine, a) {
                (Some(e), Some(_)) => e.memory().n_past(i as SeqId),
                (Some(e), None) => e.cached_tokens(i as SeqId).map_or(0, <[u32]>::len),
                (None, _) => 0,
            };
        }
        sh.deferred = self.queue.len();
        sh.deferred_tokens = self.queue.iter().map(|j| j.req.prompt.len()).sum();
        sh.totals = self.totals.clone();
        if let Some(e) = &self.engine {
            sh.memory = e.memory().usage();
            sh.ram_cache = e.ram_cache_stats();
        }
    }
}

/// What decides a plain run's tokens: the key of [`ReferenceCache`].
#[derive(PartialEq)]
struct ReferenceKey {
    prompt: Vec<u32>,
    n_predict: usize,
    sampler: specd_sampling::SamplerParams,
    logit_bias: Vec<(u32, f32)>,
    ignore_eos: bool,
    stop: Vec<String>,
    grammar: Option<specd_sampling::GrammarSpec>,
}

impl ReferenceKey {
    /// None when the run is not reproducible (a random seed under sampling).
    fn of(req: &SequenceRequest) -> Option<Self> {
        let random = req.sampler.seed == specd_sampling::RANDOM_SEED && !req.sampler.is_greedy();
        (!random).then(|| ReferenceKey {
            prompt: req.prompt.clone(),
            n_predict: req.n_predict,
            sampler: req.sampler,
            logit_bias: req.logit_bias.clone(),
            ignore_eos: req.ignore_eos,
            stop: req.stop.clone(),
            grammar: req.grammar.clone(),
        })
    }
}

/// The last synthetic reference run, reused while the same request repeats. Benchmarks send one
/// request many times; without this each speculative request first ran the whole plain
/// generation again, which doubled a benchmark's time and left the request it preceded running
/// right after another engine's allocations and memory traffic.
#[derive(Default)]
pub struct ReferenceCache(Mutex<Option<(ReferenceKey, Arc<Vec<u32>>)>>);

impl ReferenceCache {
    /// The reference for `req`: the cached one when the request is the same, else a new run.
    pub fn get_or_run(
        &self,
        model: Arc<dyn Backend>,
        req: &SequenceRequest,
        n_ctx: usize,
        kv_types: (KvType, KvType),
    ) -> Result<Arc<Vec<u32>>, ApiError> {
        let key = ReferenceKey::of(req);
        if let (Some(k), Ok(guard)) = (&key, self.0.lock()) {
            if let Some((ck, r)) = guard.as_ref() {
                if ck == k {
                    return Ok(r.clone());
                }
            }
        }
        let r = synthetic_reference(model, req, n_ctx, kv_types)?;
        if let (Some(k), Ok(mut guard)) = (key, self.0.lock()) {
            *guard = Some((k, r.clone()));
        }
        Ok(r)
    }
}

/// The plain run the synthetic drafter needs as its "true continuation": the same request
/// without speculation, on a private engine (the synthetic drafter is for benchmarks).
pub fn synthetic_reference(
    model: Arc<dyn Backend>,
    req: &SequenceRequest,
    n_ctx: usize,
    kv_types: (KvType, KvType),
) -> Result<Arc<Vec<u32>>, ApiError> {
    // The same cache types as the serving engine: the reference must be its plain output.
    let cfg = MemoryConfig {
        n_ctx,
        max_seqs: 1,
        kv_type_k: kv_types.0,
        kv_type_v: kv_types.1,
        ..MemoryConfig::default()
    };
    let mut engine = Engine::new(model, cfg, RollbackKind::Replay)
        .map_err(|e| ApiError::server(e.to_string()))?;
    let mut plain = req.clone();
    plain.spec = specd_spec::SpecParams::default();
    let out = engine
        .generate(0, plain)
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    let mut r = req.prompt.clone();
    r.extend_from_slice(&out.tokens);
    Ok(Arc::new(r))
}
