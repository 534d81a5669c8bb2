//! The ablation benchmark of `plan(Auto)`: each stage of the exact search left out in turn, on MiniMalloc's
//! challenging instances (and `../shared/traces/static` where it is there), generated instances (seeds other
//! than the tests') and the large graphs. Prints, per instance, the arena (over the lower bound) and the time
//! at which it was first reached with every stage, then per stage the instances whose arena or time to best it
//! changes; the reference runs every stage twice, before and after the others, to show the noise.
//!
//! `cargo run --release -p vrampool-plan --features generators --example ablation -- [--budget SECONDS] [--only NAME,...]
//! [--stages NAME,...] [--graph-seed N] [--random N:SEED,...] [--record FILE | --check FILE]` (by default every
//! stage, and seed 5 of each large graph family; `--random` adds `random_instance(N, SEED)` for each pair, such
//! as the large graphs bench's 30000:42,45000:42,60000:42).
//!
//! `--record` writes each instance's arena with every stage (two runs, the lower first); `--check` plans each
//! instance so once more and fails where the arena lies outside what was recorded (an instance planned at its
//! lower bound must be there again).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use vrampool_plan::{
    csv_files, large_graph, llm_decoding_instance, llm_training_instance, packed_instance, plan_with_stages,
    random_instance, read_csv, Algorithm, Buffer, GraphFamily, PlanOptions, Stage, Stages,
};

type Error = Box<dyn std::error::Error>;
/// Instances by name.
type Named = Vec<(String, Vec<Buffer>)>;

/// A change in the time to best counts where it is at least this fraction of the reference's and this long.
const TIME_CHANGE: f64 = 0.5;
const MIN_TIME_CHANGE: f64 = 0.1;

fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let (mut budget, mut only, mut record, mut check) = (Duration::from_millis(1_500), None, None, None);
    let (mut stages, mut graph_seed, mut random) = (Stage::ALL.to_vec(), 5, Vec::new());
    while let Some(arg) = args.next() {
        let value = args.next().ok_or(format!("{arg} needs a value"))?;
        match arg.as_str() {
            "--budget" => budget = Duration::from_secs_f64(value.parse()?),
            "--only" => only = Some(value.split(',').map(str::to_owned).collect::<Vec<_>>()),
            "--record" => record = Some(PathBuf::from(value)),
            "--graph-seed" => graph_seed = value.parse()?,
            "--stages" => {
                stages = value
                    .split(',')
                    .map(|n| Stage::ALL.into_iter().find(|s| s.name() == n).ok_or(format!("no stage {n}")))
                    .collect::<Result<_, _>>()?
            }
            "--check" => check = Some(PathBuf::from(value)),
            "--random" => {
                for pair in value.split(',') {
                    let (n, seed) = pair.split_once(':').ok_or(format!("--random takes N:SEED, not {pair}"))?;
                    random.push((n.parse::<usize>()?, seed.parse::<u64>()?));
                }
            }
            _ => return Err(format!("unknown argument {arg}").into()),
        }
    }
    let options = PlanOptions { algorithm: Algorithm::Auto, budget, alignment: 1 };
    let mut instances = instances(graph_seed)?;
    instances.extend(random.into_iter().map(|(n, seed)| (format!("random-{n}-seed-{seed}"), random_instance(n, seed))));
    let instances: Named = instances
        .into_iter()
        .filter(|(name, _)| only.as_ref().is_none_or(|o| o.iter().any(|n| name.contains(n.as_str()))))
        .collect();
    let run = |buffers: &[Buffer], stages: Stages| -> Result<Run, Error> {
        let (p, reached) = plan_with_stages(buffers, &options, stages)?;
        Ok(Run {
            arena: p.arena_bytes,
            bound: p.lower_bound_bytes,
            seconds: reached.map_or(p.seconds, |t| t.as_secs_f64()),
        })
    };
    if let Some(path) = check {
        return check_against(&path, &instances, |b| run(b, Stages::ALL));
    }
    if let Some(path) = record {
        let mut lines = String::from("# instance,arena (two runs of every stage, the lower first),lower bound\n");
        for (name, buffers) in &instances {
            let (a, b) = (run(buffers, Stages::ALL)?, run(buffers, Stages::ALL)?);
            lines += &format!("{name},{},{},{}\n", a.arena.min(b.arena), a.arena.max(b.arena), a.bound);
            println!("{name}: {} {} (bound {})", a.arena, b.arena, a.bound);
        }
        std::fs::write(path, lines)?;
        return Ok(());
    }

    println!("budget {budget:?} a run; arena / lower bound (time to best, s)\n");
    println!("{:<34} {:>7} {:>21} {:>21}", "instance", "n", "every stage", "every stage again");
    // Per stage, the instances whose arena or time to best the stage's absence changes.
    let mut changes: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (name, buffers) in &instances {
        let first = run(buffers, Stages::ALL)?;
        let without: Vec<(Stage, Run)> =
            stages.iter().map(|&s| Ok((s, run(buffers, Stages::ALL.without(s))?))).collect::<Result<_, Error>>()?;
        let again = run(buffers, Stages::ALL)?;
        println!("{name:<34} {:>7} {:>21} {:>21}", buffers.len(), first.cell(), again.cell());
        let (low, high) = (first.arena.min(again.arena), first.arena.max(again.arena));
        let (fast, slow) = (first.seconds.min(again.seconds), first.seconds.max(again.seconds));
        for (stage, r) in without {
            let arena_changed = r.arena < low || r.arena > high;
            let margin = (slow * TIME_CHANGE).max(MIN_TIME_CHANGE);
            let time_changed = r.arena == low && (r.seconds > slow + margin || r.seconds + margin < fast);
            let entry = changes.entry(stage.name()).or_default();
            if arena_changed || time_changed {
                entry.push(format!("{name} {}", r.cell()));
            }
            println!("  without {:<14} {:>21}", stage.name(), r.cell());
        }
    }
    println!("\nstage          instances whose arena or time to best changes without it (arena / bound, time to best)");
    for &stage in &stages {
        let list = changes.get(stage.name()).map(|l| l.join("; ")).unwrap_or_default();
        println!("{:<14} {}", stage.name(), if list.is_empty() { "none".to_owned() } else { list });
    }
    Ok(())
}

struct Run {
    arena: u64,
    bound: u64,
    seconds: f64,
}

impl Run {
    fn cell(&self) -> String {
        format!("{:.4} ({:.2})", self.arena as f64 / self.bound as f64, self.seconds)
    }
}

/// Plans each recorded instance with every stage and compares the arena with the figures in `path`.
fn check_against(
    path: &PathBuf,
    instances: &Named,
    run: impl Fn(&[Buffer]) -> Result<Run, Error>,
) -> Result<(), Error> {
    let text = std::fs::read_to_string(path)?;
    let mut failed = 0;
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let fields: Vec<&str> = line.split(',').collect();
        let [name, low, high, bound] = fields[..] else { return Err(format!("bad line {line}").into()) };
        let (low, high, bound): (u64, u64, u64) = (low.parse()?, high.parse()?, bound.parse()?);
        let Some((_, buffers)) = instances.iter().find(|(n, _)| n == name) else { continue };
        let r = run(buffers)?;
        let ok = r.bound == bound && (low..=high).contains(&r.arena);
        failed += usize::from(!ok);
        println!("{name:<34} {:>12} in {low}..={high}: {}", r.arena, if ok { "same" } else { "CHANGED" });
    }
    if failed > 0 {
        return Err(format!("{failed} instances changed").into());
    }
    Ok(())
}

/// MiniMalloc's challenging instances (and the shared traces), generated instances with seeds other than the
/// tests', and one seed of each large graph family.
fn instances(graph_seed: u64) -> Result<Named, Error> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut found: Named = Vec::new();
    for path in csv_files(&[root.join("tests/data/static"), root.join("../shared/traces/static")]) {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        found.push((name, read_csv(std::fs::File::open(&path)?)?));
    }
    found.extend([
        ("random-2000-seed-101".to_owned(), random_instance(2_000, 101)),
        ("random-30000-seed-102".to_owned(), random_instance(30_000, 102)),
        ("packed-200-drop-20-seed-1001".to_owned(), packed_instance(200, 1024, 1024, 20, 1001)),
        ("packed-240-drop-10-seed-1002".to_owned(), packed_instance(240, 1024, 1024, 10, 1002)),
        ("decoding-4-64-40-2048".to_owned(), llm_decoding_instance(4, 64, 40, 2048)),
        ("training-8-4-1024-11".to_owned(), llm_training_instance(8, 4, 1024, 11)),
    ]);
    found.extend(
        GraphFamily::ALL
            .map(|family| (format!("{}-seed-{graph_seed}", family.name()), large_graph(family, graph_seed))),
    );
    Ok(found)
}
