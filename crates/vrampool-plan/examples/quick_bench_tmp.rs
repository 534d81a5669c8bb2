use std::time::Instant;
use vrampool_plan::{quick_plan, read_csv};
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let buffers = read_csv(std::fs::File::open(&args[0]).unwrap()).unwrap();
    let n: usize = args.get(1).map_or(20, |s| s.parse().unwrap());
    let mut times = Vec::new();
    let mut arena = 0;
    for _ in 0..n {
        let t = Instant::now();
        let q = quick_plan(&buffers, 512).unwrap();
        times.push(t.elapsed().as_secs_f64() * 1e3);
        arena = q.plan.arena_bytes;
    }
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!("{} buffers: min {:.2} ms, arena {}", buffers.len(), times[0], arena);
}
