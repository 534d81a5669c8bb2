use super::*;
use crate::peers::PeerModel;
use vrampool_core::device::{SimDevice, SimMode};
use vrampool_core::sizes::{GIB, KIB};

fn torch(conf: &str, capacity: u64) -> Caching {
    let super::super::PeerConfig::Torch(options) = super::super::PeerConfig::parse("torch", conf).unwrap() else { unreachable!() };
    Caching::torch(options, Arc::new(SimDevice::new(capacity, SimMode::AddressOnly)), Some(capacity))
}

fn reserved(model: &Caching) -> u64 {
    model.figures().reserved
}

#[test]
fn segment_sizes_follow_the_request_classes() {
    // <= 1 MiB: a 2 MiB small segment; 1-10 MiB: a 20 MiB segment; from 10 MiB (after the
    // 512 B rounding): the request rounded to 2 MiB. A large block keeps a remainder of at
    // most 1 MiB (it is not split off), so it counts as allocated.
    for (request, segment, allocated) in [
        (1, 2 * MIB, 512),
        (MIB, 2 * MIB, MIB),
        (3 * MIB / 2, 20 * MIB, 3 * MIB / 2),
        (10 * MIB - 512, 20 * MIB, 10 * MIB - 512),
        (10 * MIB - 1, 10 * MIB, 10 * MIB),
        (21 * MIB + 1, 22 * MIB, 22 * MIB),
    ] {
        let mut model = torch("", GIB);
        model.allocate(request, 0).unwrap();
        assert_eq!((reserved(&model), model.figures().allocated), (segment, allocated), "{request}");
    }
}

#[test]
fn a_cached_block_is_split_by_the_pool_rules_and_merges_back() {
    let mut model = torch("", GIB);
    // 1.5 MiB from a 20 MiB segment: the 18.5 MiB remainder is split off and serves the next.
    let a = model.allocate(3 * MIB / 2, 0).unwrap();
    let b = model.allocate(8 * MIB, 0).unwrap();
    assert_eq!(b, a + 3 * MIB / 2);
    assert_eq!(reserved(&model), 20 * MIB);
    model.free(a).unwrap();
    model.free(b).unwrap();
    // Merged back whole: a 19 MiB request fits without a new segment.
    let c = model.allocate(19 * MIB, 0).unwrap();
    assert_eq!((c, reserved(&model)), (a, 20 * MIB));
    // A large block is not split for a remainder of 1 MiB or less: all 20 MiB stay allocated.
    assert_eq!(model.figures().allocated, 20 * MIB);
    // Small pool: any remainder of at least 512 B is split off.
    let s = model.allocate(1000, 0).unwrap();
    let t = model.allocate(512, 0).unwrap();
    assert_eq!(t, s + 1024);
    assert_eq!(reserved(&model), 22 * MIB);
}

#[test]
fn streams_do_not_share_cached_blocks() {
    let mut model = torch("", GIB);
    let a = model.allocate(4 * MIB, 0).unwrap();
    model.free(a).unwrap();
    model.allocate(4 * MIB, 1).unwrap();
    assert_eq!(reserved(&model), 40 * MIB, "stream 1 cannot use stream 0's cached segment");
}

#[test]
fn out_of_memory_releases_the_cache_and_retries_once() {
    let mut model = torch("", 60 * MIB);
    let a = model.allocate(30 * MIB, 0).unwrap();
    model.free(a).unwrap();
    // 40 MiB does not fit in the cached 30 MiB: the cached segment goes back, then it fits.
    model.allocate(40 * MIB, 0).unwrap();
    assert_eq!((reserved(&model), model.figures().alloc_retries, model.figures().device_frees), (40 * MIB, 1, 1));
    assert!(matches!(model.allocate(30 * MIB, 0), Err(PoolError::OutOfMemory(r)) if r.reserved == 40 * MIB));
}

#[test]
fn max_split_size_keeps_oversize_blocks_whole_and_for_oversize_requests() {
    let mut model = torch("max_split_size_mb:32", GIB);
    let big = model.allocate(64 * MIB, 0).unwrap();
    model.free(big).unwrap();
    // A request below max_split_size may not take the oversize block: a new segment.
    model.allocate(12 * MIB, 0).unwrap();
    assert_eq!(reserved(&model), 76 * MIB);
    // An oversize request takes it only within max_non_split_rounding (20 MiB): 50 MiB does...
    let c = model.allocate(50 * MIB, 0).unwrap();
    assert_eq!((c, reserved(&model)), (big, 76 * MIB));
    assert_eq!(model.figures().allocated, 12 * MIB + 64 * MIB, "and is not split");
    model.free(c).unwrap();
    // ...40 MiB does not.
    model.allocate(40 * MIB, 0).unwrap();
    assert_eq!(reserved(&model), 116 * MIB);
}

#[test]
fn max_split_size_releases_oversize_segments_before_everything() {
    let mut model = torch("max_split_size_mb:32", 200 * MIB);
    let small = model.allocate(4 * MIB, 0).unwrap();
    model.free(small).unwrap();
    let big = model.allocate(120 * MIB, 0).unwrap();
    model.free(big).unwrap();
    // 100 MiB may not take the cached 120 MiB (20 MiB too large) and does not fit beside it:
    // the oversize segment goes back, the 20 MiB one stays, and no full release is needed.
    model.allocate(100 * MIB, 0).unwrap();
    assert_eq!(reserved(&model), 120 * MIB);
    assert_eq!((model.figures().alloc_retries, model.figures().device_frees), (0, 1));
}

#[test]
fn roundup_power2_divisions_rounds_to_the_next_division() {
    assert_eq!(roundup_power2_next_division(1200, 4), 1280);
    assert_eq!(roundup_power2_next_division(1024, 4), 1024);
    assert_eq!(roundup_power2_next_division(1280, 4), 1280);
    let model = torch("roundup_power2_divisions:4", GIB);
    assert_eq!(model.round_size(5 * MIB), 5 * MIB, "a division boundary stays");
    assert_eq!(model.round_size(5 * MIB + 1), 6 * MIB);
    assert_eq!(model.round_size(1000), 1024, "at most 512 B times the divisions: 512 B steps");
    assert_eq!(model.round_size(300), 512);
    // The first entry covers the intervals below it; `>` the ones from the last named on
    // (that one included, as PyTorch fills it).
    let model = torch("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]", GIB);
    assert_eq!(model.round_size(5 * MIB + 1), 5 * MIB + 512);
    assert_eq!(model.round_size(300 * MIB), 300 * MIB);
    assert_eq!(model.round_size(600 * MIB), 768 * MIB);
    assert_eq!(model.round_size(1500 * MIB), 1536 * MIB);
    assert_eq!(model.round_size(5 * GIB + 1), 5 * GIB + 512 * MIB);
}

#[test]
fn garbage_collection_frees_old_cached_segments_above_the_threshold() {
    let run = |conf: &str| {
        let mut model = torch(conf, 100 * MIB);
        let old = model.allocate(30 * MIB, 0).unwrap();
        model.free(old).unwrap();
        let young = model.allocate(40 * MIB, 0).unwrap();
        model.free(young).unwrap();
        // 45 MiB fits neither cached segment, and 70 + 46 MiB exceeds the device.
        model.allocate(45 * MIB, 0).unwrap();
        model
    };
    // Above 50 MiB reserved, the collector frees the older segment (aged 2 lookups against the
    // younger one's 1) before the device is asked: no out-of-memory retry, the younger stays.
    let collected = run("garbage_collection_threshold:0.5");
    let f = collected.figures();
    assert_eq!((f.reserved, f.device_frees, f.alloc_retries), (86 * MIB, 1, 0));
    let mut collected = collected;
    collected.allocate(40 * MIB, 0).unwrap();
    assert_eq!(reserved(&collected), 86 * MIB, "the 40 MiB segment stayed cached");
    // Without it, the device refuses and every cached segment goes.
    let f = run("").figures();
    assert_eq!((f.reserved, f.device_frees, f.alloc_retries), (46 * MIB, 2, 1));
}

#[test]
fn expandable_segments_map_whole_pages_of_one_growing_range() {
    let mut model = torch("expandable_segments:True", 8 * GIB);
    // 25 MiB in the large pool maps two 20 MiB pages; the rest of them serves the next request.
    let a = model.allocate(25 * MIB, 0).unwrap();
    assert_eq!(reserved(&model), 40 * MIB);
    let b = model.allocate(10 * MIB, 0).unwrap();
    assert_eq!((b, reserved(&model)), (a + 25 * MIB, 40 * MIB));
    // The next block spans the end of the mapped range: only the missing page is mapped.
    let c = model.allocate(10 * MIB, 0).unwrap();
    assert_eq!((c, reserved(&model)), (b + 10 * MIB, 60 * MIB));
    // A small request maps a 2 MiB page of the small pool's own range.
    model.allocate(4 * KIB, 0).unwrap();
    assert_eq!(reserved(&model), 62 * MIB);
    // Out of memory unmaps every free page and retries.
    model.free(a).unwrap();
    model.free(b).unwrap();
    let mut tight = torch("expandable_segments:True", 80 * MIB);
    let x = tight.allocate(50 * MIB, 0).unwrap();
    tight.free(x).unwrap();
    let y = tight.allocate(10 * MIB, 1).unwrap();
    assert_eq!(reserved(&tight), 80 * MIB);
    tight.free(y).unwrap();
    tight.allocate(70 * MIB, 2).unwrap();
    assert_eq!((reserved(&tight), tight.figures().alloc_retries), (80 * MIB, 1));
}

#[test]
fn the_driver_pool_maps_2_mib_pages_for_every_size() {
    let AsyncOptions { .. } = AsyncOptions::default();
    let mut model = Caching::driver_async(AsyncOptions::default(), Arc::new(SimDevice::new(GIB, SimMode::AddressOnly)), None);
    let a = model.allocate(3 * MIB, 0).unwrap();
    let b = model.allocate(512, 0).unwrap();
    assert_eq!((b, model.figures().reserved), (a + 3 * MIB, 4 * MIB));
    let mut trimmed =
        Caching::driver_async(AsyncOptions { release_threshold: 0 }, Arc::new(SimDevice::new(GIB, SimMode::AddressOnly)), None);
    let a = trimmed.allocate(6 * MIB, 0).unwrap();
    trimmed.free(a).unwrap();
    assert_eq!(trimmed.figures().reserved, 0, "a threshold of 0 gives every free page back");
}
