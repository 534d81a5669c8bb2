//! Pause and resume of tagged regions on the simulated device: every address kept, the memory
//! given back and brought back, other memory untouched, faults that leave everything consistent.

use std::sync::Arc;

use vrampool_core::{Device, MemoryResource, Pool, PoolConfig, PoolError, PrivatePools, Scrub, SimDevice, SimMode, StrategyKind, StreamId};

const MIB: u64 = 1 << 20;
const S0: StreamId = StreamId(0);

struct Setup {
    sim: Arc<SimDevice>,
    pools: PrivatePools<Pool>,
}

fn setup(config: PoolConfig) -> Setup {
    let sim = Arc::new(SimDevice::new(4 << 30, SimMode::HostBacked));
    let device: Arc<dyn Device> = sim.clone();
    let pool = Pool::new(Arc::clone(&device), config.clone()).unwrap();
    Setup { sim, pools: PrivatePools::new(pool, device, config) }
}

/// `n` buffers of assorted sizes allocated in `tag`'s region, each filled with its own byte.
fn fill(s: &Setup, tag: Option<&str>, n: u64, seed: u8) -> Vec<(u64, Vec<u8>)> {
    if let Some(tag) = tag {
        s.pools.begin_tag(tag).unwrap();
    }
    let buffers = (0..n)
        .map(|i| {
            let size = [512, 4096, 100_000, 3 * MIB, 9 * MIB + 7][i as usize % 5];
            let addr = s.pools.allocate(size, S0).unwrap();
            let bytes = vec![seed.wrapping_add(i as u8); size as usize];
            s.sim.write(addr, &bytes).unwrap();
            (addr, bytes)
        })
        .collect();
    if let Some(tag) = tag {
        assert!(s.pools.end_tag(tag));
    }
    buffers
}

fn assert_intact(s: &Setup, buffers: &[(u64, Vec<u8>)]) {
    for (addr, bytes) in buffers {
        assert!(s.sim.read(*addr, bytes.len() as u64).unwrap() == *bytes, "the bytes at {addr:#x} changed");
    }
}

fn tag_reserved(s: &Setup, tag: &str) -> u64 {
    s.pools.tags().into_iter().find(|t| t.name == tag).unwrap().reserved
}

#[test]
fn a_pause_gives_the_tags_memory_back_and_a_resume_restores_every_byte_at_the_same_address() {
    let s = setup(PoolConfig::default());
    let plain = fill(&s, None, 10, 1);
    let kv = fill(&s, Some("kv"), 10, 50);
    let weights = fill(&s, Some("weights"), 5, 100);
    let reserved = tag_reserved(&s, "kv");
    let used = s.sim.counters().used;
    let report = s.pools.pause(Some("kv"), true).unwrap();
    assert_eq!(report.released, reserved, "every mapped byte of the tag goes back");
    let requested: u64 = kv.iter().map(|(_, b)| b.len() as u64).sum();
    assert!((requested..requested + 512 * 10).contains(&report.backed_up), "the live blocks, whole: {}", report.backed_up);
    assert!(s.sim.counters().used <= used - reserved * 99 / 100, "the device's memory rose by the tag's pages");
    assert!(s.sim.read(kv[0].0, 1).is_err(), "the tag's addresses hold no memory while paused");
    let kv_info = s.pools.tags().into_iter().find(|t| t.name == "kv").unwrap();
    assert!(kv_info.paused && kv_info.paused_bytes == reserved && kv_info.reserved == 0, "{kv_info:?}");
    assert_eq!(s.pools.stats().paused_bytes, reserved);
    assert_intact(&s, &plain);
    assert_intact(&s, &weights);
    // Other memory works as usual; the paused tag refuses, naming itself.
    let other = s.pools.allocate(MIB, S0).unwrap();
    s.pools.free(other, None, None).unwrap();
    s.pools.begin_tag("kv").unwrap();
    let refused = s.pools.allocate(4096, S0).unwrap_err();
    assert!(matches!(&refused, PoolError::Paused(m) if m.contains("\"kv\"") && m.contains("resume")), "{refused}");
    s.pools.end_tag("kv");
    assert_eq!(s.pools.resume(Some("kv"), true).unwrap(), reserved);
    assert_intact(&s, &kv);
    assert_intact(&s, &plain);
    assert_intact(&s, &weights);
    assert_eq!(s.sim.counters().used, used);
    assert_eq!(s.pools.stats().paused_bytes, 0);
}

#[test]
fn without_a_backup_the_buffers_come_back_usable() {
    let s = setup(PoolConfig::default());
    let kv = fill(&s, Some("kv"), 6, 7);
    assert_eq!(s.pools.pause(Some("kv"), false).unwrap().backed_up, 0);
    s.pools.resume(Some("kv"), true).unwrap();
    for (addr, bytes) in &kv {
        let fresh = vec![0xEE; bytes.len()];
        s.sim.write(*addr, &fresh).unwrap();
        assert_eq!(s.sim.read(*addr, fresh.len() as u64).unwrap(), fresh);
    }
}

#[test]
fn a_hundred_cycles_leave_no_page_nor_range_behind_and_other_tags_untouched() {
    let s = setup(PoolConfig::default());
    let plain = fill(&s, None, 5, 1);
    let kv = fill(&s, Some("kv"), 8, 20);
    let weights = fill(&s, Some("weights"), 8, 90);
    let (used, ranges) = (s.sim.counters().used, s.sim.reservations());
    for cycle in 0..100 {
        let backup = cycle % 2 == 0;
        s.pools.pause(Some("kv"), backup).unwrap();
        assert_intact(&s, &weights);
        assert_intact(&s, &plain);
        s.pools.resume(Some("kv"), true).unwrap();
        if backup {
            assert_intact(&s, &kv);
        }
        assert_eq!((s.sim.counters().used, s.sim.reservations()), (used, ranges), "cycle {cycle}");
    }
    // Every tag at once, then back.
    let both = tag_reserved(&s, "kv") + tag_reserved(&s, "weights");
    assert_eq!(s.pools.pause(None, true).unwrap().released, both);
    assert_intact(&s, &plain);
    assert_eq!(s.pools.resume(None, true).unwrap(), both);
    assert_intact(&s, &weights);
    assert_eq!(s.sim.counters().used, used);
}

#[test]
fn frees_while_paused_are_honoured_and_the_freed_memory_is_reused_after() {
    let s = setup(PoolConfig { scrub: Scrub::OnFree, ..PoolConfig::default() });
    let kv = fill(&s, Some("kv"), 5, 30);
    s.pools.pause(Some("kv"), true).unwrap();
    let (gone, kept) = kv.split_at(2);
    for (addr, _) in gone {
        s.pools.free(*addr, None, None).unwrap();
    }
    assert!(s.pools.free(gone[0].0, None, None).is_err(), "a double free is refused while paused too");
    s.pools.resume(Some("kv"), true).unwrap();
    assert_intact(&s, kept);
    for (addr, bytes) in gone {
        assert!(s.sim.read(*addr, bytes.len() as u64).unwrap().iter().all(|&b| b == 0), "a block freed while paused comes back scrubbed");
    }
    s.pools.begin_tag("kv").unwrap();
    let again = s.pools.allocate(gone[0].1.len() as u64, S0).unwrap();
    s.pools.end_tag("kv");
    assert!(gone.iter().any(|(addr, _)| *addr == again), "the freed block is reused");
}

#[test]
fn a_resume_without_the_cache_leaves_free_memory_with_the_device() {
    let s = setup(PoolConfig::default());
    let kv = fill(&s, Some("kv"), 10, 5);
    for (addr, _) in &kv[..9] {
        s.pools.free(*addr, None, None).unwrap();
    }
    let before = s.sim.counters().used;
    let reserved = tag_reserved(&s, "kv");
    s.pools.pause(Some("kv"), true).unwrap();
    let mapped = s.pools.resume(Some("kv"), false).unwrap();
    assert!(mapped < reserved, "only the memory under live blocks comes back: {mapped} of {reserved}");
    assert_eq!(s.sim.counters().used, before - (reserved - mapped));
    assert_intact(&s, &kv[9..]);
    // The pool maps again when it needs memory.
    s.pools.begin_tag("kv").unwrap();
    let big = s.pools.allocate(20 * MIB, S0).unwrap();
    s.sim.write(big, &[1; 64]).unwrap();
    s.pools.end_tag("kv");
    assert_intact(&s, &kv[9..]);
}

#[test]
fn a_failed_unmap_leaves_the_tag_paused_and_pausing_again_finishes() {
    let s = setup(PoolConfig::default());
    let kv = fill(&s, Some("kv"), 10, 3);
    let reserved = tag_reserved(&s, "kv");
    s.sim.fail_unmap_in(2);
    let e = s.pools.pause(Some("kv"), true).unwrap_err();
    assert!(matches!(&e, PoolError::Paused(m) if m.contains("pausing again")), "{e}");
    assert!(s.pools.tags()[0].paused && s.pools.tags()[0].paused_bytes < reserved);
    assert!(s.pools.pause(Some("kv"), true).unwrap().released > 0);
    assert_eq!(s.pools.tags()[0].paused_bytes, reserved);
    s.pools.resume(Some("kv"), true).unwrap();
    assert_intact(&s, &kv);
}

#[test]
fn a_failed_map_on_resume_leaves_the_tag_paused_with_nothing_mapped_and_a_retry_succeeds() {
    let s = setup(PoolConfig::default());
    let kv = fill(&s, Some("kv"), 10, 9);
    s.pools.pause(Some("kv"), true).unwrap();
    let paused_used = s.sim.counters().used;
    for nth in 1..=3 {
        s.sim.fail_map_in(nth);
        let e = s.pools.resume(Some("kv"), true).unwrap_err();
        assert!(matches!(&e, PoolError::Paused(m) if m.contains("still paused")), "{e}");
        assert_eq!(s.sim.counters().used, paused_used, "nothing half-mapped after a failure at map {nth}");
        assert!(s.pools.tags()[0].paused);
    }
    s.pools.resume(Some("kv"), true).unwrap();
    assert_intact(&s, &kv);
}

#[test]
fn a_full_device_on_resume_is_a_clear_error_and_the_retry_succeeds_once_memory_is_free() {
    let s = setup(PoolConfig::default());
    let kv = fill(&s, Some("kv"), 5, 11);
    s.pools.pause(Some("kv"), true).unwrap();
    // Another user takes the memory meanwhile.
    let hog_size = s.sim.mem_info().unwrap().free - MIB;
    let hog = s.sim.alloc_segment(hog_size).unwrap();
    let e = s.pools.resume(Some("kv"), true).unwrap_err();
    assert!(matches!(&e, PoolError::Paused(m) if m.contains("out of memory") && m.contains("still paused")), "{e}");
    assert!(s.pools.tags()[0].paused);
    s.sim.free_segment(hog, hog_size).unwrap();
    s.pools.resume(Some("kv"), true).unwrap();
    assert_intact(&s, &kv);
}

#[test]
fn memory_that_cannot_keep_its_addresses_refuses_with_the_reason() {
    let sim = Arc::new(SimDevice::new(1 << 30, SimMode::HostBacked).without_vm());
    let device: Arc<dyn Device> = sim.clone();
    let pools = PrivatePools::new(Pool::new(Arc::clone(&device), PoolConfig::default()).unwrap(), device, PoolConfig::default());
    let e = pools.begin_tag("kv").unwrap_err();
    assert!(matches!(&e, PoolError::CannotPause(m) if m.contains("virtual memory")), "{e}");
    let e = pools.pause(Some("kv"), false).unwrap_err();
    assert!(e.to_string().contains("no region"), "{e}");
    // A hybrid pool's small and large tiers are plain segments.
    let sim = Arc::new(SimDevice::new(1 << 30, SimMode::HostBacked));
    let pool = Pool::new(sim, PoolConfig { strategy: StrategyKind::Hybrid, ..PoolConfig::default() }).unwrap();
    let small = pool.allocate(512, S0).unwrap();
    let e = pool.pause(false).unwrap_err();
    assert!(matches!(&e, PoolError::CannotPause(m) if m.contains("plain segments")), "{e}");
    assert!(!pool.is_paused());
    pool.free(small, None, None).unwrap();
}

#[test]
fn other_threads_allocate_and_free_untagged_and_in_other_tags_while_one_tag_pauses_and_resumes() {
    let s = Arc::new(setup(PoolConfig::default()));
    let kv = fill(&s, Some("kv"), 6, 70);
    s.pools.begin_tag("other").unwrap();
    let others: Vec<u64> = (0..64).map(|_| s.pools.allocate(64 * 1024, S0).unwrap()).collect();
    s.pools.end_tag("other");
    let workers: Vec<_> = (0..3u64)
        .map(|t| {
            let s = Arc::clone(&s);
            let mine: Vec<u64> = others.iter().copied().skip(t as usize).step_by(3).collect();
            std::thread::spawn(move || {
                for i in 0..3000u64 {
                    let a = s.pools.allocate(512 * (1 + (i + t) % 64), StreamId(t)).unwrap();
                    s.sim.write(a, &[t as u8; 512]).unwrap();
                    assert_eq!(s.sim.read(a, 512).unwrap(), vec![t as u8; 512]);
                    s.pools.free(a, None, None).unwrap();
                }
                for a in mine {
                    s.pools.free(a, None, None).unwrap();
                }
            })
        })
        .collect();
    for _ in 0..50 {
        s.pools.pause(Some("kv"), true).unwrap();
        s.pools.resume(Some("kv"), true).unwrap();
    }
    workers.into_iter().for_each(|w| w.join().unwrap());
    assert_intact(&s, &kv);
    let other = s.pools.tags().into_iter().find(|t| t.name == "other").unwrap();
    assert_eq!(other.allocated, 0, "every free in the other tag went through");
}
