//! The offline provider: a deterministic local
//! heuristic that says in its output that it is not an LLM, so the whole pipeline runs offline.

use crate::domain::{Lane, TokenUsage, sha256_hex};
use crate::ports::{DeltaSink, LlmClient, LlmError, LlmRequest, LlmResponse};
use async_trait::async_trait;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Model name reported by the offline provider.
pub const OFFLINE_MODEL: &str = "offline-heuristic (not an LLM)";

/// Answers a commit-summary batch prompt in the format the commits flow asks for. Injected (by the
/// wiring) rather than imported, so the provider does not depend on the flow that uses it.
pub type BatchAnswer = fn(&str) -> String;

/// The offline provider.
#[derive(Debug, Default)]
pub struct OfflineProvider {
    latency: [Duration; 3],
    calls: [AtomicU64; 3],
    batch_answer: Option<BatchAnswer>,
}

impl OfflineProvider {
    /// A provider answering after the given simulated latency per lane.
    pub fn new(latency: impl Fn(Lane) -> Duration) -> Self {
        Self { latency: Lane::ALL.map(latency), calls: Default::default(), batch_answer: None }
    }

    /// The same provider, answering commit-summary prompts with `answer` (the commits flow's format).
    pub fn answering_batches(mut self, answer: BatchAnswer) -> Self {
        self.batch_answer = Some(answer);
        self
    }

    /// Calls made so far, over every lane.
    pub fn calls(&self) -> u64 {
        self.calls.iter().map(|c| c.load(Ordering::SeqCst)).sum()
    }

    /// Calls made so far for one lane.
    pub fn calls_for(&self, lane: Lane) -> u64 {
        self.calls[lane.index()].load(Ordering::SeqCst)
    }
}

/// Rough token count (4 bytes a token) for task answers: the offline provider has no model's tokenizer,
/// and loading one would cost task flows a second in debug builds.
fn approx_tokens(s: &str) -> u64 {
    s.len().div_ceil(4) as u64
}

/// Pieces an offline answer is streamed in.
const STREAM_PIECES: usize = 8;

#[async_trait]
impl LlmClient for OfflineProvider {
    async fn complete(&self, request: &LlmRequest) -> Result<LlmResponse, LlmError> {
        self.calls[request.lane.index()].fetch_add(1, Ordering::SeqCst);
        let answer = self.answer(request);
        let latency = self.latency_of(request, &answer);
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        Ok(answer)
    }

    /// The same answer, its words given in [`STREAM_PIECES`] pieces spread over the lane's latency.
    async fn stream(&self, request: &LlmRequest, sink: &dyn DeltaSink) -> Result<LlmResponse, LlmError> {
        self.calls[request.lane.index()].fetch_add(1, Ordering::SeqCst);
        let answer = self.answer(request);
        let pieces = pieces(&answer.text, STREAM_PIECES);
        let pause = self.latency_of(request, &answer) / pieces.len().max(1) as u32;
        for piece in pieces {
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
            sink.delta(piece);
        }
        Ok(answer)
    }
}

/// `text` cut into at most `n` pieces at word boundaries (each piece keeps its trailing space), so
/// the pieces joined are the text.
fn pieces(text: &str, n: usize) -> Vec<&str> {
    // Where each word ends, its space included: the last word has none.
    let words: Vec<usize> = text.match_indices(' ').map(|(i, _)| i + 1).collect();
    let per = (words.len() + 1).div_ceil(n.max(1)).max(1);
    let mut cuts: Vec<usize> = words.iter().copied().skip(per - 1).step_by(per).collect();
    cuts.retain(|&c| c < text.len());
    let mut out = Vec::with_capacity(cuts.len() + 1);
    let mut from = 0;
    for c in cuts {
        out.push(&text[from..c]);
        from = c;
    }
    out.push(&text[from..]);
    out
}

impl OfflineProvider {
    /// The lane's latency, for the share of the whole answer that `answer` generates (a continued
    /// answer takes less).
    fn latency_of(&self, request: &LlmRequest, answer: &LlmResponse) -> Duration {
        let latency = self.latency[request.lane.index()];
        match request.continuation() {
            None => latency,
            Some((prefix, _)) => {
                let rest = answer.text.len() as f64;
                latency.mul_f64(rest / (rest + prefix.len() as f64).max(1.0))
            }
        }
    }

    /// The deterministic answer to `request`, continued from its prefix where it has one: the rest
    /// of its own answer when the prefix is that answer's start (a run of its own taken over), else
    /// its answer after the prefix. The prefix counts as prompt, as the providers bill it.
    fn answer(&self, request: &LlmRequest) -> LlmResponse {
        let whole = self.whole_answer(request);
        let Some((prefix, left)) = request.continuation() else { return whole };
        let rest = match whole.text.strip_prefix(prefix) {
            Some(rest) => rest.to_owned(),
            None => format!(" {}", whole.text),
        };
        let usage = TokenUsage {
            prompt: whole.usage.prompt + approx_tokens(prefix),
            completion: approx_tokens(&rest),
        };
        // Cut by what is left of the cap, as the continued call's own `max_tokens` is.
        let truncated = usage.completion > u64::from(left);
        LlmResponse { text: rest, usage, truncated, ..whole }
    }

    /// The deterministic whole answer to `request`.
    fn whole_answer(&self, request: &LlmRequest) -> LlmResponse {
        if request.kind == crate::domain::Kind::CommitSummary
            && let Some(answer) = self.batch_answer
        {
            // A valid answer to the batch prompt, so the commits pipeline runs end to end offline.
            let text = answer(&request.prompt);
            let usage =
                TokenUsage { prompt: approx_tokens(&request.prompt), completion: approx_tokens(&text) };
            let truncated = usage.completion > u64::from(request.max_tokens);
            return LlmResponse {
                text,
                model: OFFLINE_MODEL.to_owned(),
                usage,
                truncated,
                limits: Default::default(),
                tier: request.tier,
                route: Default::default(),
                continued: 0,
            };
        }
        let digest = sha256_hex(request.prompt.as_bytes());
        let files = if request.target_files.is_empty() {
            "no files".to_owned()
        } else {
            request.target_files.join(", ")
        };
        let words = request.prompt.split_whitespace().count();
        let text = format!(
            "[offline provider: deterministic heuristic, NOT an LLM] {} task on {} ({} file(s)); prompt of {} \
             word(s), fingerprint {}. Configure an LLM provider for a real answer.",
            request.kind,
            files,
            request.target_files.len(),
            words,
            &digest[..12]
        );
        let usage = TokenUsage {
            prompt: approx_tokens(&request.prompt)
                + request.target_files.iter().map(|f| approx_tokens(f)).sum::<u64>(),
            completion: approx_tokens(&text),
        };
        let truncated = usage.completion > u64::from(request.max_tokens);
        LlmResponse {
            text,
            model: OFFLINE_MODEL.to_owned(),
            usage,
            truncated,
            limits: Default::default(),
            tier: request.tier,
            route: Default::default(),
            continued: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Kind;

    #[tokio::test]
    async fn deterministic_labelled_and_counted() {
        let p = OfflineProvider::new(|_| Duration::ZERO);
        let req = LlmRequest {
            lane: Lane::Interactive,
            kind: Kind::Explain,
            prompt: "what does main do?".into(),
            target_files: vec!["src/main.rs".into()],
            max_tokens: 100,
            params: Default::default(),
            tier: Default::default(),
            prefix: None,
        };
        let a = p.complete(&req).await.unwrap();
        let b = p.complete(&req).await.unwrap();
        assert_eq!(a, b);
        assert!(a.text.contains("NOT an LLM") && a.model.contains("not an LLM"));
        assert!(a.usage.prompt > 0 && a.usage.completion > 0);
        assert_eq!((p.calls(), p.calls_for(Lane::Interactive), p.calls_for(Lane::Synthesis)), (2, 2, 0));
    }

    /// Collects what a stream gives.
    #[derive(Default)]
    struct Collect(std::sync::Mutex<Vec<String>>);
    impl DeltaSink for Collect {
        fn delta(&self, text: &str) {
            self.0.lock().unwrap().push(text.to_owned());
        }
        fn restart(&self, _: &str) {
            self.0.lock().unwrap().clear();
        }
    }

    #[tokio::test]
    async fn streams_the_same_answer_in_pieces_over_its_latency() {
        let p = OfflineProvider::new(|_| Duration::from_millis(80));
        let req = LlmRequest {
            lane: Lane::Interactive,
            kind: Kind::Explain,
            prompt: "what does main do?".into(),
            target_files: vec![],
            max_tokens: 100,
            params: Default::default(),
            tier: Default::default(),
            prefix: None,
        };
        let sink = Collect::default();
        let started = tokio::time::Instant::now();
        let answer = p.stream(&req, &sink).await.unwrap();
        assert!(started.elapsed() >= Duration::from_millis(80), "spread over the latency");
        let got = sink.0.lock().unwrap().clone();
        assert_eq!(got.concat(), answer.text);
        assert!((2..=STREAM_PIECES).contains(&got.len()), "{got:?}");
        assert_eq!(answer, p.complete(&req).await.unwrap());
    }

    #[test]
    fn pieces_join_back_into_the_text() {
        for text in ["", "one", "a b", "a b c d e f g h i j k l", "trailing space ", "  two  spaces  "] {
            for n in 1..10 {
                let p = pieces(text, n);
                assert_eq!(p.concat(), text, "{text:?} in {n}");
                assert!(p.len() <= n.max(1), "{text:?} in {n}: {p:?}");
            }
        }
    }
}
