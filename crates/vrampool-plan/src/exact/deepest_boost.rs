//! The deepest-boost stage: the round robin's turns that placed the most buffers at once in their last
//! search get several times the round's node limit in the next (`probe.rs`).

/// The turns whose last search placed the most buffers at once get this many times the round's node limit.
/// On squares a search that times out is often stuck at the top of its tree (no more than 15 of 211 buffers
/// ever placed) while another order gets to 187 and finds the plan after a million nodes; with equal shares
/// the 14 turns of a round take 28 times the nodes the best one needs. 8: 62 of the 90 squares decided in
/// 5 s against 59, none lost; 32 decides 62 as well, four others won and four lost.
pub(crate) const DEEPEST_BOOST: u64 = 8;

/// The factor of `turn`'s node limit: `boost` where its last search placed the most buffers of the round
/// (`deepest`, per turn), else 1.
pub(crate) fn deepest_boost(deepest: &[usize], turn: usize, boost: u64) -> u64 {
    let most = deepest.iter().copied().max().unwrap_or(0);
    if most > 0 && deepest.get(turn) == Some(&most) {
        boost
    } else {
        1
    }
}
