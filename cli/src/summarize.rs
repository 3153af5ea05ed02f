//! `lanes summarize`: a local repository's commits through the commits pipeline, as a table or JSON.

use crate::CliError;
use clap::Args;
use lanes_core::config::LanePolicy;
use lanes_core::domain::Lane;
use lanes_core::domain::tier::TierSetting;
use std::path::PathBuf;

/// `lanes summarize`'s flags.
#[derive(Args)]
pub struct SummarizeArgs {
    /// The repository.
    #[arg(long, default_value = ".")]
    repo: PathBuf,
    /// The newest N commits.
    #[arg(long, conflicts_with = "since")]
    last: Option<usize>,
    /// Commits after REV (REV..HEAD).
    #[arg(long)]
    since: Option<String>,
    /// Directory of the embedded database.
    #[arg(long, default_value = ".lanes")]
    data_dir: PathBuf,
    /// One JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Service tier of the calls: `sync`, `flex`, `priority` or `auto` (flex while the deadline leaves
    /// room).
    #[arg(long, default_value = "auto", value_parser = parse_tier)]
    tier: TierSetting,
    /// How long the summaries may take, for `--tier auto` (e.g. `90m`, `6h`; `0` for none).
    #[arg(long, default_value = "6h", value_parser = humantime::parse_duration)]
    deadline: std::time::Duration,
}

fn parse_tier(s: &str) -> Result<TierSetting, String> {
    TierSetting::parse(s).ok_or_else(|| format!("`{s}`: expected sync, flex, auto or priority"))
}

/// Summarizes and prints.
pub async fn run(args: SummarizeArgs) -> Result<(), CliError> {
    let range = match args.since {
        Some(rev) => lanes_core::summarize::Range::Since(rev),
        None => lanes_core::summarize::Range::Last(args.last.unwrap_or(20)),
    };
    let policy = LanePolicy {
        tier: args.tier,
        deadline: (!args.deadline.is_zero()).then_some(args.deadline),
        ..LanePolicy::default_for(Lane::Commits)
    };
    summarize(&args.repo, &range, (&args.data_dir, policy), args.json).await
}

async fn summarize(
    repo: &std::path::Path,
    range: &lanes_core::summarize::Range,
    (data_dir, policy): (&std::path::Path, LanePolicy),
    json: bool,
) -> Result<(), CliError> {
    use std::io::IsTerminal;
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} summarizing [{bar:30}] {pos}/{len} commits {elapsed}",
        )
        .map_err(|e| CliError::Usage(e.to_string()))?
        .progress_chars("=> "),
    );
    // Only on a terminal: a pipe or a log file gets the result alone.
    if !std::io::stderr().is_terminal() {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let report = lanes_core::summarize::run_local(repo, range, (data_dir, policy), |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })
    .await
    .map_err(|e| CliError::Summarize(e.to_string()))?;
    bar.finish_and_clear();
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!("{:<10}  {:<40}  {:>6}  {:<6}  {:<4}  summary", "sha", "subject", "tokens", "source", "tier");
    for row in &report.summaries {
        println!(
            "{:<10}  {:<40}  {:>6}  {:<6}  {:<4}  {}",
            &row.sha[..10.min(row.sha.len())],
            clip(&row.subject, 40),
            row.tokens,
            row.source,
            row.tier.as_str(),
            clip(&row.summary, 100)
        );
    }
    println!(
        "\n{} commits: {} LLM call(s), {} from cache, {} by rule, {} failed; {} prompt + {} completion tokens",
        report.commits,
        report.llm_calls,
        report.cache_hits,
        report.rule_summaries,
        report.failed,
        report.prompt_tokens,
        report.completion_tokens
    );
    Ok(())
}

fn clip(s: &str, n: usize) -> String {
    match s.char_indices().nth(n.saturating_sub(1)) {
        Some((i, _)) if s.chars().count() > n => format!("{}…", &s[..i]),
        _ => s.to_owned(),
    }
}
