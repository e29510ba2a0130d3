//! The stop conditions, in one place: a round's tokens enter the sequence one by one until an
//! end-of-generation token, a stop string, the token limit or the time limit ends it. (The
//! context limit ends a sequence before its next round is planned: `plan.rs`.)

use super::round::Verified;
use super::{FinishReason, GenSeq, StepEvent};
use specd_backend::SeqId;
use specd_tokenizer::Tokenizer;

/// Why and where a sequence ends: the reason and, for a stop string, the string.
pub(super) type Finish = (FinishReason, Option<String>);

impl GenSeq {
    /// Takes the round's verified tokens into the sequence up to the first stop condition; the
    /// event that reports what was emitted (if anything was) and the finish, if one was met.
    /// Text goes out complete (UTF-8) and final (no tail that may become a stop string).
    pub(super) fn take_tokens(
        &mut self,
        seq: SeqId,
        tok: &Tokenizer,
        v: &Verified,
    ) -> (Option<StepEvent>, Option<Finish>) {
        let mut emit = Vec::new();
        let mut finish = None;
        for &t in &v.tokens {
            if !self.req.ignore_eos && tok.is_eog(t) {
                self.tokens.push(t);
                self.eog = Some(t);
                finish = Some((FinishReason::Eos, None));
                break;
            }
            self.tokens.push(t);
            self.generated.push(t);
            emit.push(t);
            if let Some(pr) = v.probs.get(emit.len() - 1) {
                self.probs.push(pr.clone());
            }
            if let Some(w) = self.text.push(tok.token_to_bytes(t)) {
                finish = Some((FinishReason::Stop, Some(w)));
                break;
            }
            if self.generated.len() >= self.req.n_predict {
                finish = Some((FinishReason::Limit, None));
                break;
            }
            if self.past_time_limit(tok, t) {
                finish = Some((FinishReason::Limit, None));
                break;
            }
        }
        let text = self.text.take(finish.is_some());
        let event = (!emit.is_empty() || !text.is_empty()).then_some(StepEvent::Tokens {
            seq,
            tokens: emit,
            text,
        });
        (event, finish)
    }

    /// llama-server's `t_max_predict_ms`: past the time limit, generation ends at a token that
    /// holds a newline.
    fn past_time_limit(&self, tok: &Tokenizer, t: u32) -> bool {
        match (self.req.time_limit, self.gen_start) {
            (Some(limit), Some(t0)) => {
                tok.token_to_bytes(t).contains(&b'\n') && t0.elapsed() > limit
            }
            _ => false,
        }
    }
}
