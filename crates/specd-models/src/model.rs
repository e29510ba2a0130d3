//! [`Model`]: loading a GGUF file and the batched forward pass.

use crate::arch::Trunk;
use crate::config::ModelConfig;
use crate::layers::mtp::Mtp;
use crate::layers::{gather, SeqRows};
use crate::output::DecodeOutput;
use crate::weights::Loader;
use crate::ModelError;
use specd_backend::{Batch, BatchRow};
use specd_gguf::GgufFile;
use specd_memory::{Memory, MemoryConfig, MemoryLayout, SeqId};
use specd_ops::delta_net::GdnShape;
use specd_ops::norm::rms_norm_rows;
use specd_ops::rope::Rope;
use specd_ops::{matmul, Weight};
use specd_tokenizer::Tokenizer;
use std::collections::HashMap;
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::Arc;

/// Run-time options of a model.
#[derive(Debug, Clone)]
pub struct ModelOptions {
    /// Compute threads (0 = all cores).
    pub n_threads: usize,
    /// Rows per forward pass: longer batches (prompts) are processed in chunks of this size.
    pub n_ubatch: usize,
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions {
            n_threads: 0,
            n_ubatch: 512,
        }
    }
}

/// A loaded model, ready to decode batches against a [`Memory`].
pub struct Model {
    cfg: ModelConfig,
    tok_embd: Weight,
    output: Weight,
    output_norm: Vec<f32>,
    /// The architecture's blocks (and MTP head).
    trunk: Box<dyn Trunk>,
    rope: Rope,
    tokenizer: Tokenizer,
    /// Compute threads; shared with another model by [`Model::share_threads`].
    pool: Arc<specd_ops::pool::Pool>,
    opts: ModelOptions,
    /// Bytes of weights as the kernels hold them (mapped, repacked or converted).
    weight_bytes: usize,
    /// Bytes of the tensors in the file.
    file_weight_bytes: usize,
    /// Elements of all the file's tensors (llama.cpp's `n_params`).
    n_params: u64,
    /// The file type's name, as llama.cpp gives it ("Q4_K - Medium").
    file_type: String,
}

impl Model {
    /// Opens and loads a GGUF file.
    pub fn load(path: impl AsRef<Path>, opts: ModelOptions) -> Result<Self, ModelError> {
        let g = GgufFile::open(path.as_ref())?;
        Self::from_gguf(&g, opts)
    }

    /// Loads from an opened GGUF file (weights stay in its memory map).
    pub fn from_gguf(g: &GgufFile, opts: ModelOptions) -> Result<Self, ModelError> {
        let cfg = ModelConfig::from_gguf(g)?;
        let tokenizer = crate::vocab::tokenizer_from_gguf(g)?;
        if tokenizer.n_vocab() != cfg.n_vocab {
            return Err(ModelError::Invalid(format!(
                "tokenizer has {} tokens but the model {} rows",
                tokenizer.n_vocab(),
                cfg.n_vocab
            )));
        }
        let l = Loader::new(g);
        let h = cfg.n_embd;
        let tok_embd = l.matrix("token_embd.weight", cfg.n_vocab, h)?;
        let output = match l.matrix_opt("output.weight", cfg.n_vocab, h)? {
            Some(w) => w,
            None => tok_embd.clone(),
        };
        let output_norm = l.vector("output_norm.weight", h)?;
        let trunk = (cfg.arch.def().load)(&l, &cfg)?;
        l.check_all_read()?;
        let rope = Rope::new(cfg.n_rot, cfg.rope_base, cfg.rope_mode.clone());
        let n_threads = if opts.n_threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            opts.n_threads
        };
        let pool = specd_ops::pool::Pool::new(n_threads)
            .map(Arc::new)
            .map_err(|e| ModelError::Invalid(format!("thread pool: {e}")))?;
        let weight_bytes = l.loaded_bytes();
        let file_bytes: usize = g.tensors().iter().map(|t| t.n_bytes() as usize).sum();
        let n_params: u64 = g.tensors().iter().map(|t| t.n_elements()).sum();
        if opts.n_ubatch == 0 {
            return Err(ModelError::Invalid("n_ubatch must be at least 1".into()));
        }
        Ok(Model {
            cfg,
            tok_embd,
            output,
            output_norm,
            trunk,
            rope,
            tokenizer,
            pool,
            opts,
            weight_bytes,
            file_weight_bytes: file_bytes,
            n_params,
            file_type: specd_gguf::file_type_of(g),
        })
    }

    /// Hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }
    /// The tokenizer from the file.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }
    /// Runs this model on `other`'s compute threads instead of its own: a draft model and its
    /// target never compute at once, and two pools on the same cores would compete — a
    /// worker spins for a while after its work ends before it sleeps, so each switch between
    /// the models would briefly put twice as many busy threads as cores.
    pub fn share_threads(mut self, other: &Model) -> Self {
        self.pool = other.pool.clone();
        self
    }
    /// Compute threads.
    pub fn n_threads(&self) -> usize {
        self.pool.n_threads()
    }
    /// Bytes of weights as held in memory for the kernels (mapped, repacked or converted).
    pub fn weight_bytes(&self) -> usize {
        self.weight_bytes
    }
    /// Bytes of the tensors in the model file.
    pub fn file_weight_bytes(&self) -> usize {
        self.file_weight_bytes
    }
    /// Parameters: the elements of every tensor in the file.
    pub fn n_params(&self) -> u64 {
        self.n_params
    }
    /// The file type's name, as llama.cpp gives it ("all F32", "Q4_K - Medium", …).
    pub fn file_type(&self) -> &str {
        &self.file_type
    }
    /// One line for logs: weight memory against the file's tensor bytes.
    pub fn weights_summary(&self) -> String {
        let mib = |b: usize| b as f64 / (1 << 20) as f64;
        format!(
            "weights: {:.1} MiB in memory for {:.1} MiB of tensors in the file ({:.3}x)",
            mib(self.weight_bytes),
            mib(self.file_weight_bytes),
            self.weight_bytes as f64 / self.file_weight_bytes.max(1) as f64
        )
    }
    /// True if the file carries an MTP head.
    pub fn has_mtp(&self) -> bool {
        self.trunk.mtp().is_some()
    }
    /// Shapes of the per-sequence memory this model needs.
    pub fn memory_layout(&self) -> MemoryLayout {
        let tm = self.trunk.memory();
        let ssm = tm.ssm;
        MemoryLayout {
            attn_layers: tm.attn_layers,
            kv_row: self.cfg.n_head_kv * self.cfg.head_dim,
            rec_layers: tm.rec_layers,
            conv_kernel: ssm.map_or(2, |s| s.conv_kernel),
            conv_channels: ssm.map_or(0, |s| s.conv_dim()),
            gdn: ssm.map_or(
                GdnShape {
                    n_k: 1,
                    n_v: 1,
                    d_k: 0,
                    d_v: 0,
                    tiled: true,
                },
                |s| s.gdn_shape(),
            ),
        }
    }
    /// A fresh memory for this model.
    pub fn new_memory(&self, cfg: MemoryConfig) -> Memory {
        Memory::new(self.memory_layout(), cfg)
    }

    /// Decodes a batch: every row's token is appended to its sequence; logits (and hidden states
    /// if asked) are returned for rows with `logits` set. Batches longer than `n_ubatch` rows are
    /// processed in chunks. On error the memory is left as it was before the failing chunk.
    pub fn decode(&self, mem: &mut Memory, batch: &Batch) -> Result<DecodeOutput, ModelError> {
        self.decode_with(mem, batch, &mut |_| ControlFlow::Continue(()))
    }

    /// [`Model::decode`], calling `on_chunk(rows_done)` after each chunk of `n_ubatch` rows, so
    /// a caller can report how far a long prompt has got while the batch is still running —
    /// and stop it there: after `ControlFlow::Break` the rows of the chunks done so far are in
    /// memory (and in the output), the rest are not (a prompt whose client has gone frees its
    /// slot within one chunk).
    pub fn decode_with(
        &self,
        mem: &mut Memory,
        batch: &Batch,
        on_chunk: &mut dyn FnMut(usize) -> ControlFlow<()>,
    ) -> Result<DecodeOutput, ModelError> {
        let mut out = DecodeOutput::default();
        self.decode_chunks(mem, batch, &mut out, on_chunk)?;
        Ok(out)
    }

    /// [`Model::decode_with`] into `out`, whose previous contents are replaced. Its buffers are
    /// reused: a caller that decodes step after step with the same `out` saves a verification
    /// batch's logits (megabytes) from being allocated and zeroed every step — the LM head
    /// writes every value, so the buffer of the widest batch so far is written over as it is.
    pub fn decode_into(
        &self,
        mem: &mut Memory,
        batch: &Batch,
        out: &mut DecodeOutput,
    ) -> Result<(), ModelError> {
        self.decode_chunks(mem, batch, out, &mut |_| ControlFlow::Continue(()))
            .map(|_| ())
    }

    /// [`Model::decode_into`] with [`Model::decode_with`]'s `on_chunk`; returns the rows
    /// decoded.
    pub fn decode_chunks(
        &self,
        mem: &mut Memory,
        batch: &Batch,
        out: &mut DecodeOutput,
        on_chunk: &mut dyn FnMut(usize) -> ControlFlow<()>,
    ) -> Result<usize, ModelError> {
        out.reset(self.cfg.n_vocab, self.cfg.n_embd);
        self.validate(mem, batch)?;
        let ub = self.opts.n_ubatch;
        let mut done = batch.rows.len();
        for start in (0..batch.rows.len()).step_by(ub) {
            let end = (start + ub).min(batch.rows.len());
            self.pool
                .install(|| self.forward(mem, batch, start, end, out))?;
            if on_chunk(end).is_break() {
                done = end;
                break;
            }
        }
        out.finish(batch.want_hidden);
        Ok(done)
    }

    fn validate(&self, mem: &Memory, batch: &Batch) -> Result<(), ModelError> {
        let mut next: HashMap<u32, u32> = HashMap::new();
        for (i, r) in batch.rows.iter().enumerate() {
            if r.token as usize >= self.cfg.n_vocab {
                return Err(ModelError::BadBatch(format!(
                    "row {i}: token {} out of vocabulary ({})",
                    r.token, self.cfg.n_vocab
                )));
            }
            let want = *next.entry(r.seq).or_insert(mem.n_past(r.seq) as u32);
            if r.pos != want {
                return Err(ModelError::BadBatch(format!(
                    "row {i}: sequence {} expects position {want}, got {}",
                    r.seq, r.pos
                )));
            }
            next.insert(r.seq, want + 1);
        }
        for (&seq, &end) in &next {
            if end as usize > mem.config().n_ctx {
                return Err(specd_memory::MemoryError::ContextFull {
                    seq,
                    needed: end as usize,
                    n_ctx: mem.config().n_ctx,
                }
                .into());
            }
        }
        let new_seqs = next.keys().filter(|s| !mem.sequences().contains(s)).count();
        if mem.sequences().len() + new_seqs > mem.config().max_seqs {
            return Err(specd_memory::MemoryError::TooManySequences(mem.config().max_seqs).into());
        }
        Ok(())
    }

    /// One chunk `start..end` of the batch through the whole trunk.
    fn forward(
        &self,
        mem: &mut Memory,
        batch: &Batch,
        start: usize,
        end: usize,
        out: &mut DecodeOutput,
    ) -> Result<(), ModelError> {
        let rows = &batch.rows[start..end];
        let n = rows.len();
        let h = self.cfg.n_embd;
        // Group rows by sequence, in order of first appearance.
        let mut groups: Vec<SeqRows> = Vec::new();
        for (i, r) in rows.iter().enumerate() {
            match groups.iter_mut().find(|g| g.seq == r.seq) {
                Some(g) => {
                    g.rows.push(i);
                    g.positions.push(r.pos);
                }
                None => groups.push(SeqRows {
                    seq: r.seq,
                    rows: vec![i],
                    positions: vec![r.pos],
                }),
            }
        }
        let mut begun = Vec::new();
        for g in &groups {
            if let Err(e) = mem.begin_batch(g.seq, g.positions[0] as usize, g.rows.len()) {
                for &s in &begun {
                    mem.abort_batch(s);
                }
                return Err(e.into());
            }
            begun.push(g.seq);
        }
        let result = self.run_trunk(mem, rows, &groups);
        let x = match result {
            Ok(x) => x,
            Err(e) => {
                for &s in &begun {
                    mem.abort_batch(s);
                }
                return Err(e);
            }
        };
        for g in &groups {
            mem.end_batch(g.seq)?;
        }
        // Final norm and LM head for the rows that want logits.
        let want: Vec<usize> = rows
            .iter()
            .enumerate()
            .filter(|(_, r)| r.logits)
            .map(|(i, _)| i)
            .collect();
        if batch.want_hidden {
            // Every row's normed final hidden state (the MTP head's input).
            let mut all = vec![0f32; n * h];
            rms_norm_rows(&x, &self.output_norm, self.cfg.eps, &mut all);
            out.hidden.extend_from_slice(&all);
        }
        if want.is_empty() {
            return Ok(());
        }
        let xs = gather(&x, h, &want);
        let mut hn = specd_ops::scratch::Buf::output(xs.len());
        rms_norm_rows(&xs, &self.output_norm, self.cfg.eps, &mut hn);
        // The LM head writes straight into the output: a verification batch's logits are
        // megabytes (rows × vocabulary), and a second buffer plus a copy cost as much as a
        // small matmul. The buffer grows only where it is too short (see `decode_into`).
        let len = want.len() * self.cfg.n_vocab;
        let base = out.rows.len() * self.cfg.n_vocab;
        if out.logits.len() < base + len {
            if base == 0 && out.logits.capacity() < len {
                // A new buffer: zeroed memory from the allocator (fresh pages are zero) rather
                // than a pass over it.
                out.logits = vec![0f32; len];
            } else {
                out.logits.resize(base + len, 0.0);
            }
        }
        matmul(
            &hn,
            want.len(),
            &self.output,
            &mut out.logits[base..base + len],
        )?;
        out.rows.extend(want.iter().map(|i| i + start));
        Ok(())
    }

    /// Embeddings → all blocks. Returns the residual stream `n × n_embd`.
    fn run_trunk(
        &self,
        mem: &mut Memory,
        rows: &[BatchRow],
        groups: &[SeqRows],
    ) -> Result<Vec<f32>, ModelError> {
        let mut x = self.embed(rows.iter().map(|r| r.token));
        self.trunk
            .forward(&mut x, rows.len(), groups, &self.rope, mem)?;
        Ok(x)
    }

    /// Embedding rows of `tokens`.
    pub fn embed(&self, tokens: impl Iterator<Item = u32>) -> Vec<f32> {
        let h = self.cfg.n_embd;
        let tokens: Vec<u32> = tokens.collect();
        let mut x = vec![0f32; tokens.len() * h];
        for (i, &t) in tokens.iter().enumerate() {
            self.tok_embd
                .dequantize_row(t as usize, &mut x[i * h..(i + 1) * h]);
        }
        x
    }

    /// A memory for the MTP head: one attention layer with the trunk's KV shape.
    pub fn new_mtp_memory(&self, cfg: MemoryConfig) -> Result<Memory, ModelError> {
        if self.trunk.mtp().is_none() {
            return Err(ModelError::Invalid(
                "the model has no MTP (NextN) head".into(),
            ));
        }
        let mut layout = self.memory_layout();
        layout.attn_layers = 1;
        layout.rec_layers = 0;
        layout.conv_channels = 0;
        layout.gdn.d_k = 0;
        layout.gdn.d_v = 0;
        Ok(Memory::new(layout, cfg))
    }

    /// Runs the MTP head over rows of one sequence (docs/qwen35.md §3.7): row `i` is token
    /// `tokens[i]` at position `pos0 + i`, paired with the hidden state `h_prev[i]` of the
    /// position before it (the target's, or the head's own output when drafting recursively).
    /// Returns the head's normed output for every row (`n × n_embd`) and the logits of the last
    /// row. `mem` must come from [`Model::new_mtp_memory`].
    pub fn decode_mtp(
        &self,
        mem: &mut Memory,
        seq: specd_memory::SeqId,
        tokens: &[u32],
        pos0: usize,
        h_prev: &[f32],
    ) -> Result<(Vec<f32>, Vec<f32>), ModelError> {
        let mtp = self
            .trunk
            .mtp()
            .ok_or_else(|| ModelError::Invalid("the model has no MTP (NextN) head".into()))?;
        let (n, h) = (tokens.len(), self.cfg.n_embd);
        if n == 0 || h_prev.len() != n * h {
            return Err(ModelError::BadBatch(format!(
                "MTP: {n} tokens with {} hidden values",
                h_prev.len()
            )));
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= self.cfg.n_vocab) {
            return Err(ModelError::BadBatch(format!(
                "MTP: token {t} out of vocabulary"
            )));
        }
        if mem.n_past(seq) != pos0 {
            return Err(ModelError::BadBatch(format!(
                "MTP: sequence {seq} expects position {}, got {pos0}",
                mem.n_past(seq)
            )));
        }
        if pos0 + n > mem.config().n_ctx {
            return Err(specd_memory::MemoryError::ContextFull {
                seq,
                needed: pos0 + n,
                n_ctx: mem.config().n_ctx,
            }
            .into());
        }
        let emb = match &mtp.embed {
            Some(e) => {
                let mut x = vec![0f32; n * h];
                for (i, &t) in tokens.iter().enumerate() {
                    e.dequantize_row(t as usize, &mut x[i * h..(i + 1) * h]);
                }
                x
            }
            None => self.embed(tokens.iter().copied()),
        };
        let groups = [SeqRows {
            seq,
            rows: (0..n).collect(),
            positions: (pos0 as u32..(pos0 + n) as u32).collect(),
        }];
        mem.begin_batch(seq, pos0, n)?;
        let r = self.pool.install(|| {
            mtp.forward(
                &emb,
                h_prev,
                n,
                &groups,
                &self.rope,
                mem,
                &self.output_norm,
                &self.output,
                &[n - 1],
            )
        });
        match r {
            Ok(v) => {
                mem.end_batch(seq)?;
                Ok(v)
            }
            Err(e) => {
                mem.abort_batch(seq);
                Err(e)
            }
        }
    }

    /// The MTP head, if the file has one.
    pub fn mtp(&self) -> Option<&Mtp> {
        self.trunk.mtp()
    }
    /// The model's output norm and LM head (shared with the MTP head).
    pub fn output_head(&self) -> (&[f32], &Weight) {
        (&self.output_norm, &self.output)
    }
    /// The rotary table.
    pub fn rope(&self) -> &Rope {
        &self.rope
    }
    /// Runs `f` inside this model's compute pool.
    pub fn install<R>(&self, f: impl FnOnce() -> R) -> R {
        self.pool.install(f)
    }

    /// Removes the last `n` tokens of `seq` from `mem` ([`Memory::rollback`]) on this model's
    /// threads: the replayed recurrence is parallel over heads, and called from outside the
    /// pool every layer's kernel would go to rayon's global pool — other threads, woken and put
    /// to sleep many times a round, competing with the model's spinning ones.
    // Out of line: inlined into its callers, it moved the decode path's code enough to slow
    // prompt processing measurably (the A/B runs are in commit 3901648's message).
    #[inline(never)]
    pub fn rollback(
        &self,
        mem: &mut Memory,
        seq: SeqId,
        n: usize,
    ) -> Result<(), specd_memory::MemoryError> {
        self.install(|| mem.rollback(seq, n))
    }
}
