//! Micro-batching of commit summaries: each commit becomes a prompt section, sections are packed
//! first-fit-decreasing into calls under a prompt-token budget, and the model answers one JSON array
//! keyed by sha, which is validated entry by entry. Also the offline provider's honest answer to such
//! a prompt, and the apportioning of a call's tokens to its commits.

use crate::domain::Sha;
use serde::Deserialize;
use std::collections::HashMap;

/// Default prompt-token budget of one summary call (sections only; the instructions come on top): six
/// commits cut to the full 4,000-token diff budget, each with its ~100-token section frame and subject,
/// fit one call exactly, so big commits do not leave a sixth of every call empty.
pub const BATCH_TOKENS: usize = 6 * (crate::commits::budget::DIFF_TOKENS + 100);
/// Most commits in one call, so the answer fits the completion limit.
pub const MAX_COMMITS_PER_CALL: usize = 40;
/// Completion tokens reserved per commit in a call.
pub const COMPLETION_TOKENS_PER_COMMIT: u32 = 120;

const SECTION_START: &str = "=== commit ";
const SECTION_END: &str = "=== end ";

/// The instructions at the top of every summary prompt (the system prompt says the same in short).
pub const INSTRUCTIONS: &str = "Summarize each Git commit below for a changelog: one or two plain sentences \
saying what changed and why it matters, no preamble. Each commit is between `=== commit <sha>` and \
`=== end <sha>`; lines starting `[lanes:` mark parts that were cut or omitted. Answer with only a JSON \
array, one object per commit: [{\"sha\": \"<full sha>\", \"summary\": \"<text>\"}].";

/// One commit's section of a prompt.
pub fn section(sha: &Sha, subject: &str, diff: &str) -> String {
    let mut s = format!("{SECTION_START}{sha}\nsubject: {subject}\n{diff}");
    if !s.ends_with('\n') {
        s.push('\n');
    }
    s.push_str(SECTION_END);
    s.push_str(sha);
    s.push('\n');
    s
}

/// The whole prompt of one call.
pub fn build_prompt<'a>(sections: impl IntoIterator<Item = &'a str>) -> String {
    let mut p = String::from(INSTRUCTIONS);
    p.push_str("\n\n");
    for s in sections {
        p.push_str(s);
        p.push('\n');
    }
    p
}

/// Packs items of the given token sizes into bins of at most `budget` tokens and `max_items` items,
/// first-fit decreasing. Returns bins of item indices; an item larger than the budget gets a bin of
/// its own.
pub fn pack(sizes: &[usize], budget: usize, max_items: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by(|&a, &b| sizes[b].cmp(&sizes[a]).then(a.cmp(&b)));
    let mut bins: Vec<(usize, Vec<usize>)> = Vec::new();
    for i in order {
        let size = sizes[i];
        match bins.iter_mut().find(|(used, items)| used + size <= budget && items.len() < max_items.max(1)) {
            Some((used, items)) => {
                *used += size;
                items.push(i);
            }
            None => bins.push((size, vec![i])),
        }
    }
    bins.into_iter().map(|(_, items)| items).collect()
}

#[derive(Deserialize)]
struct Entry {
    sha: String,
    summary: String,
}

/// The valid entries of a model's answer, by full sha. An entry counts when its sha is one of
/// `expected` (or an unambiguous prefix of at least 7 characters of one) and its summary is a
/// non-empty string of at most 2,000 characters. Anything else is left out, so its commit is
/// retried alone.
pub fn parse_answer(text: &str, expected: &[&str]) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let (Some(start), Some(end)) = (text.find('['), text.rfind(']')) else { return out };
    if end < start {
        return out;
    }
    let Ok(values) = serde_json::from_str::<Vec<serde_json::Value>>(&text[start..=end]) else { return out };
    for v in values {
        let Ok(entry) = serde_json::from_value::<Entry>(v) else { continue };
        let sha = entry.sha.trim().to_ascii_lowercase();
        let summary = entry.summary.trim();
        if summary.is_empty() || summary.chars().count() > 2_000 || sha.len() < 7 {
            continue;
        }
        let matches: Vec<&&str> = expected.iter().filter(|e| e.starts_with(sha.as_str())).collect();
        if let [full] = matches.as_slice() {
            out.entry((**full).to_owned()).or_insert_with(|| summary.to_owned());
        }
    }
    out
}

/// Splits `total` in proportion to `weights`, by largest remainder, so the parts add up exactly.
pub fn apportion(total: u64, weights: &[u64]) -> Vec<u64> {
    if weights.is_empty() {
        return Vec::new();
    }
    let sum: u64 = weights.iter().sum();
    if sum == 0 {
        let n = weights.len() as u64;
        return (0..n).map(|i| total / n + u64::from(i < total % n)).collect();
    }
    let exact: Vec<(u64, u128)> = weights
        .iter()
        .map(|&w| {
            let num = total as u128 * w as u128;
            ((num / sum as u128) as u64, num % sum as u128)
        })
        .collect();
    let mut parts: Vec<u64> = exact.iter().map(|(q, _)| *q).collect();
    let mut left = total - parts.iter().sum::<u64>();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| exact[b].1.cmp(&exact[a].1).then(a.cmp(&b)));
    for i in order {
        if left == 0 {
            break;
        }
        parts[i] += 1;
        left -= 1;
    }
    parts
}

/// The offline provider's answer to a summary prompt: a valid JSON array whose summaries say they
/// come from a heuristic, built from each section's subject and files.
pub fn offline_answer(prompt: &str) -> String {
    let mut entries = Vec::new();
    let mut current: Option<(String, String, Vec<String>)> = None;
    for line in prompt.lines() {
        if let Some(sha) = line.strip_prefix(SECTION_START) {
            current = Some((sha.trim().to_owned(), String::new(), Vec::new()));
        } else if line.starts_with(SECTION_END) {
            if let Some((sha, subject, files)) = current.take() {
                let shown: Vec<&str> = files.iter().take(4).map(String::as_str).collect();
                let more = files.len().saturating_sub(shown.len());
                let files_text = match (files.len(), more) {
                    (0, _) => "no file changes".to_owned(),
                    (_, 0) => format!("touches {}", shown.join(", ")),
                    _ => format!("touches {} and {more} more", shown.join(", ")),
                };
                let subject = if subject.is_empty() { "(no subject)".to_owned() } else { subject };
                entries.push(serde_json::json!({
                    "sha": sha,
                    "summary": format!("[offline heuristic, not an LLM] {subject} ({files_text})."),
                }));
            }
        } else if let Some((_, subject, files)) = current.as_mut() {
            if let Some(s) = line.strip_prefix("subject: ").filter(|_| subject.is_empty()) {
                *subject = s.to_owned();
            } else if line.starts_with("diff --git ") {
                let path = line.rsplit(" b/").next().unwrap_or(line).to_owned();
                files.push(path);
            }
        }
    }
    serde_json::Value::Array(entries).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_fit_decreasing() {
        let bins = pack(&[5, 9, 2, 4, 6, 1, 3], 10, 10);
        assert_eq!(bins, vec![vec![1, 5], vec![4, 3], vec![0, 6, 2]]);
        assert_eq!(pack(&[20, 1], 10, 10), vec![vec![0], vec![1]], "oversized items get their own bin");
        assert_eq!(pack(&[1; 5], 100, 2).len(), 3, "item cap");
        assert!(pack(&[], 10, 10).is_empty());
    }

    #[test]
    fn answers_are_validated_entry_by_entry() {
        let a = "a".repeat(40);
        let b = "b".repeat(40);
        let c = "c".repeat(40);
        let text = format!(
            "Sure! ```json\n[{{\"sha\":\"{a}\",\"summary\":\" Adds X. \"}},{{\"sha\":\"bbbbbbb\",\"summary\":\"Fixes Y.\"}},\
             {{\"sha\":\"{c}\",\"summary\":\"\"}},{{\"sha\":\"dddddddd\",\"summary\":\"?\"}},{{\"oops\":1}}]\n```"
        );
        let got = parse_answer(&text, &[&a, &b, &c]);
        assert_eq!(got.len(), 2);
        assert_eq!(got[&a], "Adds X.");
        assert_eq!(got[&b], "Fixes Y.");
        assert!(parse_answer("not json", &[&a]).is_empty());
        assert!(parse_answer("] [", &[&a]).is_empty());
    }

    #[test]
    fn apportioning_adds_up() {
        assert_eq!(apportion(10, &[1, 1, 1]), vec![4, 3, 3]);
        assert_eq!(apportion(100, &[3, 1]), vec![75, 25]);
        assert_eq!(apportion(5, &[0, 0]), vec![3, 2]);
        assert_eq!(apportion(7, &[]), Vec::<u64>::new());
        let parts = apportion(12_345, &[17, 4_000, 250, 3]);
        assert_eq!(parts.iter().sum::<u64>(), 12_345);
    }

    #[test]
    fn the_offline_answer_is_valid_and_honest() {
        let a: Sha = "a".repeat(40).parse().unwrap();
        let s = section(&a, "Fix the parser", "diff --git a/src/p.rs b/src/p.rs\n@@ -1 +1 @@\n+x\n");
        let prompt = build_prompt([s.as_str()]);
        let answer = offline_answer(&prompt);
        let got = parse_answer(&answer, &[&a]);
        assert!(
            got[a.as_str()].contains("not an LLM")
                && got[a.as_str()].contains("Fix the parser")
                && got[a.as_str()].contains("src/p.rs")
        );
    }
}
