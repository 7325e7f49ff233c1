//! The interconnect index of one node: every GPU group ranked by how well it is connected,
//! computed once per link matrix so that choosing a group at request time is a scan, not a search.
//!
//! A group's connectivity is its weakest pair first (a ring all-reduce runs at the speed of its
//! slowest hop), then the sum over all pairs. Choosing a group for `k` GPUs takes the best-connected
//! groups inside the free set and, among equals, the one whose leftover free GPUs keep the
//! best-connected large groups intact (compared from the largest power-of-two size down).
//!
//! Nodes of up to 8 GPUs (nearly all) go one step further: every answer, for every free set and
//! size, is tabulated when the index is built, so a request reads one byte. The search stays as
//! the way larger nodes are answered and as the reference the tables are checked against.

/// The most GPUs one node may have: node GPU sets are 64-bit masks.
pub const MAX_GPUS_PER_NODE: usize = 64;

/// How two GPUs of one node are connected, best first when compared by [`Link::rank`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Link {
    /// NVLink with this many links between the pair.
    NvLink(u8),
    /// Behind the same PCIe switch.
    SameSwitch,
    /// Through the same host bridge (CPU root complex).
    HostBridge,
    /// Across CPU sockets.
    CrossSocket,
}

impl Link {
    /// Higher is better connected; any NVLink beats any PCIe path.
    pub fn rank(self) -> u32 {
        match self {
            Self::CrossSocket => 1,
            Self::HostBridge => 2,
            Self::SameSwitch => 3,
            Self::NvLink(links) => 10 + u32::from(links),
        }
    }
}

/// The link between every pair of a node's GPUs, indexed by position in the node's GPU list.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LinkMatrix {
    size: usize,
    cells: Vec<Link>,
}

impl LinkMatrix {
    /// All pairs equally connected: what a node without per-GPU detail gets.
    pub fn uniform(size: usize) -> Self {
        Self {
            size,
            cells: vec![Link::SameSwitch; size * size],
        }
    }

    /// Builds a matrix from a function of two positions; it is made symmetric from the upper half.
    pub fn from_fn(size: usize, link: impl Fn(usize, usize) -> Link) -> Self {
        let mut matrix = Self::uniform(size);
        for a in 0..size {
            for b in (a + 1)..size {
                let value = link(a, b);
                matrix.cells[a * size + b] = value;
                matrix.cells[b * size + a] = value;
            }
        }
        matrix
    }

    /// How many GPUs the matrix covers.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The link between positions `a` and `b` (a GPU is best connected to itself).
    pub fn get(&self, a: usize, b: usize) -> Link {
        if a == b {
            return Link::NvLink(u8::MAX);
        }
        self.cells
            .get(a * self.size + b)
            .copied()
            .unwrap_or(Link::CrossSocket)
    }

    /// The NVLink islands: for each position, the number of its island (positions joined by
    /// NVLink, directly or through others, share one; numbered from 0 in order of their lowest
    /// position), or `None` for a GPU with no NVLink to any other.
    pub fn nvlink_islands(&self) -> Vec<Option<u16>> {
        let mut islands: Vec<Option<u16>> = vec![None; self.size];
        let mut next: u16 = 0;
        for start in 0..self.size {
            if islands[start].is_some()
                || !(0..self.size)
                    .any(|b| b != start && matches!(self.get(start, b), Link::NvLink(_)))
            {
                continue;
            }
            let mut stack = vec![start];
            islands[start] = Some(next);
            while let Some(a) = stack.pop() {
                for (b, island) in islands.iter_mut().enumerate() {
                    if b != a && island.is_none() && matches!(self.get(a, b), Link::NvLink(_)) {
                        *island = Some(next);
                        stack.push(b);
                    }
                }
            }
            next = next.saturating_add(1);
        }
        islands
    }
}

/// Nodes with more GPUs than this are indexed greedily instead of exhaustively (2^12 subsets).
const EXHAUSTIVE_LIMIT: usize = 12;

/// Nodes with at most this many GPUs get every answer tabulated: a free set is then a byte, and
/// the tables of one node take 256 masks × 9 sizes × 2 bytes plus 256 connectivities (6.5 KiB).
const TABULATED_LIMIT: usize = 8;

/// How well a group is connected: weakest link rank in the high half, sum of ranks in the low half.
pub type Connectivity = u64;

fn connectivity(links: &LinkMatrix, mask: u64) -> Connectivity {
    if mask.count_ones() < 2 {
        return u64::from(u32::MAX) << 32;
    }
    let mut weakest = u32::MAX;
    let mut total: u32 = 0;
    for a in positions(mask) {
        for b in positions(above(mask, a)) {
            let rank = links.get(a, b).rank();
            weakest = weakest.min(rank);
            total = total.saturating_add(rank);
        }
    }
    (u64::from(weakest) << 32) | u64::from(total)
}

/// The bits of `mask` above `position`.
fn above(mask: u64, position: usize) -> u64 {
    if position >= MAX_GPUS_PER_NODE - 1 {
        0
    } else {
        mask & (u64::MAX << (position + 1))
    }
}

/// The positions set in a mask, ascending.
pub fn positions(mask: u64) -> impl Iterator<Item = usize> {
    // Walks the set bits only: masks are scanned on every filter and score, and most are sparse.
    let mut rest = mask;
    std::iter::from_fn(move || {
        if rest == 0 {
            return None;
        }
        let position = rest.trailing_zeros() as usize;
        rest &= rest - 1;
        Some(position)
    })
}

/// The mask bit of a GPU position. Node GPU sets are 64-bit masks, so a position past the 64th
/// has no bit and its GPU is never chosen; a plain shift would panic in debug builds and, in
/// release builds, alias the GPU onto position `p % 64` and hand out a busy GPU.
pub fn bit(position: usize) -> u64 {
    u32::try_from(position)
        .ok()
        .and_then(|shift| 1u64.checked_shl(shift))
        .unwrap_or(0)
}

/// The ranked GPU groups of one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopologyIndex {
    size: usize,
    /// All pairs equally connected: every group of a size is as good as any other.
    uniform: bool,
    /// The rank of every pair of a uniform node (kept so that its groups are rated without
    /// reading the link matrix).
    uniform_rank: u32,
    /// `ranked[k]`: the groups of `k` GPUs, best connected first (ties: lowest positions first).
    ranked: Vec<Vec<(u64, Connectivity)>>,
    /// `best_possible[k]`, computed at build time when that is cheap (uniform or exhaustively
    /// indexed nodes): scoring asks for it on every multi-GPU placement.
    best_possible: Vec<Option<Connectivity>>,
    /// Every answer of [`TopologyIndex::best_group`] and [`TopologyIndex::choose_group`] for a
    /// non-uniform node of up to [`TABULATED_LIMIT`] GPUs, computed at build time from the
    /// search's own rules; `None` for the others, which search at request time.
    tables: Option<Box<Tables>>,
    links: LinkMatrix,
}

/// The tabulated answers of one index, for free sets within the node's positions (a mask below
/// `1 << size`, so a byte) and group sizes `1..=size`. A group mask of 0 means "none".
#[derive(Clone, Debug, PartialEq, Eq)]
struct Tables {
    /// `1 << size`: how many free sets there are.
    masks: usize,
    /// `best[k * masks + free]`: the group [`TopologyIndex::best_group`] finds.
    best: Box<[u8]>,
    /// `chosen[k * masks + free]`: the group [`TopologyIndex::choose_group`] hands out.
    chosen: Box<[u8]>,
    /// `connectivity[group]` of every group.
    connectivity: Box<[Connectivity]>,
}

impl Tables {
    /// The slot of `(free, k)`, when both are within the tables (`free` inside the node's
    /// positions; `k` at most the node's size, which `get` checks against the table's length).
    fn slot(&self, free: u64, k: usize) -> Option<usize> {
        let free = usize::try_from(free)
            .ok()
            .filter(|&free| free < self.masks)?;
        k.checked_mul(self.masks)?.checked_add(free)
    }

    fn best(&self, free: u64, k: usize) -> Option<Option<(u64, Connectivity)>> {
        let group = *self.best.get(self.slot(free, k)?)?;
        Some((group != 0).then(|| (u64::from(group), self.connectivity[usize::from(group)])))
    }

    fn chosen(&self, free: u64, k: usize) -> Option<Option<u64>> {
        let group = *self.chosen.get(self.slot(free, k)?)?;
        Some((group != 0).then_some(u64::from(group)))
    }
}

/// The leftover value of a free set (see [`TopologyIndex::leftover_value`]) without allocating:
/// one entry per power-of-two group size below the node size, at most 6 for 64 GPUs.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Leftover {
    values: [Connectivity; 6],
}

impl TopologyIndex {
    /// Indexes a link matrix without tabulating: every answer is searched at request time. This
    /// is how nodes of more than 8 GPUs are answered, and the reference the tables are checked
    /// against (the engine's tests compare decisions on both).
    pub fn build_searching(links: &LinkMatrix) -> Self {
        let size = links.size().min(MAX_GPUS_PER_NODE);
        let uniform = (0..size)
            .flat_map(|a| ((a + 1)..size).map(move |b| (a, b)))
            .all(|(a, b)| links.get(a, b) == links.get(0, 1.min(size.saturating_sub(1))));
        let mut ranked = vec![Vec::new(); size + 1];
        if !uniform && size <= EXHAUSTIVE_LIMIT {
            for mask in 1u64..(1u64 << size) {
                let k = mask.count_ones() as usize;
                ranked[k].push((mask, connectivity(links, mask)));
            }
            for groups in &mut ranked {
                groups.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| lowest_first(a.0, b.0)));
            }
        }
        let mut index = Self {
            size,
            uniform,
            uniform_rank: links.get(0, 1).rank(),
            ranked,
            best_possible: Vec::new(),
            tables: None,
            links: links.clone(),
        };
        if uniform || size <= EXHAUSTIVE_LIMIT {
            index.best_possible = (0..=size)
                .map(|k| index.best_group(index.all(), k).map(|(_, conn)| conn))
                .collect();
        }
        index
    }

    /// Indexes a link matrix, tabulating every answer when the node is small enough and not
    /// uniformly connected (uniform nodes answer in closed form already).
    pub fn build(links: &LinkMatrix) -> Self {
        let mut index = Self::build_searching(links);
        if !index.uniform && index.size <= TABULATED_LIMIT {
            index.tables = Some(Box::new(index.tabulate()));
        }
        index
    }

    /// The link matrix this index was built from.
    pub fn links(&self) -> &LinkMatrix {
        &self.links
    }

    /// Whether the answers are tabulated (see [`TopologyIndex::build`]).
    pub fn is_tabulated(&self) -> bool {
        self.tables.is_some()
    }

    /// Every answer of the search, for every free set within the node and every size 1..=size.
    ///
    /// The best groups follow from the ranked lists directly: the best group of `k` in `free` is
    /// the first group of `ranked[k]` inside `free`, so walking `ranked[k]` in order and giving
    /// each group to every superset that has none yet gives each free set its first group
    /// (3^8 steps for 8 GPUs, not 256 scans). The chosen groups then run the search's own tie
    /// rule (`choose_group_by`), reading leftover values from these tables.
    fn tabulate(&self) -> Tables {
        let size = self.size;
        let masks = 1usize << size;
        let all = masks - 1;
        let mut best = vec![0u8; (size + 1) * masks].into_boxed_slice();
        for (k, groups) in self.ranked.iter().enumerate().skip(1) {
            let row = &mut best[k * masks..(k + 1) * masks];
            for &(group, _) in groups {
                let group = group as usize;
                let rest = all & !group;
                // Every superset of `group` within the node: `group` plus each subset of `rest`.
                let mut extra = rest;
                loop {
                    let free = group | extra;
                    if row[free] == 0 {
                        row[free] = group as u8;
                    }
                    if extra == 0 {
                        break;
                    }
                    extra = (extra - 1) & rest;
                }
            }
        }
        let connectivity: Box<[Connectivity]> = (0..masks as u64)
            .map(|group| connectivity(&self.links, group))
            .collect();
        let mut tables = Tables {
            masks,
            chosen: Box::default(),
            best,
            connectivity,
        };
        // The leftover value of every free set, once: the tie rule compares them for every
        // equally good group of every size.
        let best_group = |free: u64, k: usize| tables.best(free, k).flatten();
        let leftovers: Vec<Leftover> = (0..masks as u64)
            .map(|free| self.leftover_by(free, best_group))
            .collect();
        let leftover = |free: u64| {
            leftovers
                .get(free as usize)
                .copied()
                .unwrap_or_else(|| self.leftover_by(free, best_group))
        };
        let mut chosen = vec![0u8; tables.best.len()];
        for k in 1..=size {
            for free in 0..masks as u64 {
                let group = self.choose_group_by(free, k, best_group, leftover);
                chosen[k * masks + free as usize] = group.map_or(0, |group| group as u8);
            }
        }
        tables.chosen = chosen.into_boxed_slice();
        tables
    }

    /// [`connectivity`] of any `k` GPUs of a uniform node, without reading the link matrix:
    /// every pair has the same rank.
    fn uniform_connectivity(&self, k: usize) -> Connectivity {
        if k < 2 {
            return u64::from(u32::MAX) << 32;
        }
        let rank = self.uniform_rank;
        let pairs = u32::try_from(k * (k - 1) / 2).unwrap_or(u32::MAX);
        (u64::from(rank) << 32) | u64::from(rank.saturating_mul(pairs))
    }

    /// Every position of the node.
    fn all(&self) -> u64 {
        if self.size >= 64 {
            u64::MAX
        } else {
            (1u64 << self.size) - 1
        }
    }

    /// Whether every pair of GPUs is connected alike.
    pub fn is_uniform(&self) -> bool {
        self.uniform
    }

    /// The best group of `k` GPUs inside `free`, with its connectivity.
    pub fn best_group(&self, free: u64, k: usize) -> Option<(u64, Connectivity)> {
        if k == 0 {
            return None;
        }
        // Free sets with a position the index does not cover, and sizes beyond the node, are
        // not tabulated: the search answers them (its greedy branch may pick such positions).
        if let Some(answer) = self.tables.as_ref().and_then(|tables| tables.best(free, k)) {
            return answer;
        }
        self.search_best_group(free, k)
    }

    /// [`TopologyIndex::best_group`] by search.
    fn search_best_group(&self, free: u64, k: usize) -> Option<(u64, Connectivity)> {
        if k == 0 || (free.count_ones() as usize) < k {
            return None;
        }
        if self.uniform {
            let group = lowest_bits(free, k);
            return Some((group, self.uniform_connectivity(k)));
        }
        match self.ranked.get(k) {
            Some(groups) if !groups.is_empty() => {
                groups.iter().find(|(mask, _)| mask & !free == 0).copied()
            }
            _ => {
                let group = self.greedy_group(free, k)?;
                Some((group, connectivity(&self.links, group)))
            }
        }
    }

    /// The connectivity of the best group of `k` on an empty node: the yardstick for scores.
    pub fn best_possible(&self, k: usize) -> Option<Connectivity> {
        match self.best_possible.get(k) {
            Some(&cached) => cached,
            None => self.best_group(self.all(), k).map(|(_, conn)| conn),
        }
    }

    /// The group of `k` GPUs to hand out from `free`: best connected, and among equals the one
    /// that leaves the best large groups free.
    pub fn choose_group(&self, free: u64, k: usize) -> Option<u64> {
        if k > 0
            && let Some(answer) = self
                .tables
                .as_ref()
                .and_then(|tables| tables.chosen(free, k))
        {
            return answer;
        }
        let best_group = |free: u64, k: usize| self.search_best_group(free, k);
        self.choose_group_by(free, k, best_group, |free| {
            self.leftover_by(free, best_group)
        })
    }

    /// The search behind [`TopologyIndex::choose_group`], with the best groups from
    /// `best_group` and the leftover values from `leftover`: the search itself, or the tables
    /// while they are being built.
    fn choose_group_by(
        &self,
        free: u64,
        k: usize,
        best_group: impl Fn(u64, usize) -> Option<(u64, Connectivity)>,
        leftover: impl Fn(u64) -> Leftover,
    ) -> Option<u64> {
        let (first, best) = best_group(free, k)?;
        if self.uniform || self.ranked.get(k).is_none_or(Vec::is_empty) {
            return Some(first);
        }
        let mut chosen = first;
        let mut chosen_value = leftover(free & !first);
        for &(mask, conn) in &self.ranked[k] {
            if conn != best {
                break;
            }
            if mask & !free != 0 || mask == first {
                continue;
            }
            let value = leftover(free & !mask);
            if value > chosen_value {
                chosen = mask;
                chosen_value = value;
            }
        }
        Some(chosen)
    }

    /// How valuable a set of free GPUs is for later multi-GPU pods: for each power-of-two group
    /// size from the largest down, the connectivity of the best group of that size inside it.
    pub fn leftover_value(&self, free: u64) -> Vec<Connectivity> {
        let sizes = self.leftover_sizes();
        self.leftover(free).values[..sizes].to_vec()
    }

    /// How many power-of-two sizes (2, 4, 8, ...) are below the node size.
    fn leftover_sizes(&self) -> usize {
        let mut count = 0;
        let mut size = 2;
        while size < self.size {
            count += 1;
            size *= 2;
        }
        count
    }

    /// [`TopologyIndex::leftover_value`] in a fixed array, largest size first, zero-padded:
    /// compared between free sets of one node, the padding is equal and the order is the same.
    fn leftover(&self, free: u64) -> Leftover {
        self.leftover_by(free, |free, k| self.best_group(free, k))
    }

    /// [`TopologyIndex::leftover`] with the best groups from `best_group`.
    fn leftover_by(
        &self,
        free: u64,
        best_group: impl Fn(u64, usize) -> Option<(u64, Connectivity)>,
    ) -> Leftover {
        let mut values = [0; 6];
        let sizes = self.leftover_sizes();
        for (slot, exponent) in values.iter_mut().zip((1..=sizes).rev()) {
            *slot = best_group(free, 1 << exponent).map_or(0, |(_, conn)| conn);
        }
        Leftover { values }
    }

    fn greedy_group(&self, free: u64, k: usize) -> Option<u64> {
        // Start from each free GPU, grow by the GPU best linked to the group; keep the best.
        let mut best: Option<(u64, Connectivity)> = None;
        for start in positions(free) {
            let mut group = 1u64 << start;
            while (group.count_ones() as usize) < k {
                let next = positions(free & !group).max_by_key(|&candidate| {
                    positions(group)
                        .map(|member| self.links.get(member, candidate).rank())
                        .min()
                })?;
                group |= 1u64 << next;
            }
            let conn = connectivity(&self.links, group);
            if best.is_none_or(|(_, c)| conn > c) {
                best = Some((group, conn));
            }
        }
        best.map(|(group, _)| group)
    }
}

/// Orders masks so that the one holding the lowest positions comes first.
fn lowest_first(a: u64, b: u64) -> std::cmp::Ordering {
    a.reverse_bits().cmp(&b.reverse_bits()).reverse()
}

/// The `k` lowest set bits of `mask`.
pub fn lowest_bits(mask: u64, k: usize) -> u64 {
    let mut out = 0u64;
    let mut rest = mask;
    for _ in 0..k {
        if rest == 0 {
            break;
        }
        let bit = rest & rest.wrapping_neg();
        out |= bit;
        rest &= !bit;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Link;

    /// Two NVLink islands of four (0-3 and 4-7), PCIe across sockets between them.
    pub(crate) fn two_islands() -> LinkMatrix {
        LinkMatrix::from_fn(8, |a, b| {
            if a / 4 == b / 4 {
                Link::NvLink(2)
            } else {
                Link::CrossSocket
            }
        })
    }

    #[test]
    fn nvlink_islands_join_linked_gpus_and_leave_pcie_only_gpus_out() {
        // 0-1 and 2-3 joined by NVLink; 1-2 only PCIe; 4 has no NVLink at all.
        let links = LinkMatrix::from_fn(5, |a, b| match (a, b) {
            (0, 1) | (2, 3) => Link::NvLink(2),
            _ => Link::SameSwitch,
        });
        assert_eq!(
            links.nvlink_islands(),
            vec![Some(0), Some(0), Some(1), Some(1), None]
        );
        assert_eq!(LinkMatrix::uniform(3).nvlink_islands(), vec![None; 3]);
    }

    #[test]
    fn four_gpus_get_one_whole_island() {
        let index = TopologyIndex::build(&two_islands());
        let group = index.choose_group(0xFF, 4).unwrap();
        assert!(group == 0x0F || group == 0xF0, "got {group:#x}");
    }

    #[test]
    fn two_gpus_do_not_break_the_only_intact_island() {
        let index = TopologyIndex::build(&two_islands());
        // GPU 1 is taken: island 0-3 is broken, island 4-7 is intact.
        let free = 0xFF & !(1 << 1);
        let group = index.choose_group(free, 2).unwrap();
        assert_eq!(
            group & 0xF0,
            0,
            "the pair must come from the broken island, got {group:#x}"
        );
    }

    #[test]
    fn one_gpu_goes_where_it_breaks_least() {
        let index = TopologyIndex::build(&two_islands());
        let free = 0xFF & !(1 << 5);
        let group = index.choose_group(free, 1).unwrap();
        assert_eq!(
            group & 0x0F,
            0,
            "single GPU should come from the already broken island"
        );
    }

    #[test]
    fn uniform_nodes_take_the_lowest_free_positions() {
        let index = TopologyIndex::build(&LinkMatrix::uniform(8));
        assert!(index.is_uniform());
        assert_eq!(index.choose_group(0b1011_0110, 3), Some(0b0001_0110));
        assert_eq!(index.best_group(0b11, 3), None);
    }

    #[test]
    fn large_nodes_fall_back_to_a_greedy_group() {
        let links = LinkMatrix::from_fn(16, |a, b| {
            if a / 8 == b / 8 {
                Link::NvLink(1)
            } else {
                Link::HostBridge
            }
        });
        let index = TopologyIndex::build(&links);
        let group = index.choose_group(0xFFFF, 8).unwrap();
        assert!(group == 0x00FF || group == 0xFF00, "got {group:#x}");
    }

    /// A link from a small alphabet, so that random matrices have many equally good groups
    /// (ties are where the choice rules matter).
    fn link(code: u8) -> Link {
        match code % 5 {
            0 => Link::NvLink(2),
            1 => Link::NvLink(1),
            2 => Link::SameSwitch,
            3 => Link::HostBridge,
            _ => Link::CrossSocket,
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// The tables answer exactly as the search they replace, for every free set of the node
        /// and every size, and free sets reaching past the node fall back to the search.
        #[test]
        fn tabulated_answers_equal_the_search(
            size in 1usize..=8,
            codes in proptest::collection::vec(0u8..5, 64),
            wide in proptest::collection::vec(proptest::prelude::any::<u64>(), 8),
        ) {
            let links = LinkMatrix::from_fn(size, |a, b| link(codes[a * 8 + b]));
            let tabulated = TopologyIndex::build(&links);
            let searching = TopologyIndex::build_searching(&links);
            proptest::prop_assert_eq!(tabulated.is_tabulated(), !searching.is_uniform());
            let masks = (0..1u64 << size).chain(wide);
            for free in masks {
                for k in 0..=size + 1 {
                    proptest::prop_assert_eq!(
                        tabulated.best_group(free, k),
                        searching.best_group(free, k),
                        "best_group({:#x}, {})", free, k
                    );
                    proptest::prop_assert_eq!(
                        tabulated.choose_group(free, k),
                        searching.choose_group(free, k),
                        "choose_group({:#x}, {})", free, k
                    );
                }
                proptest::prop_assert_eq!(
                    tabulated.leftover_value(free),
                    searching.leftover_value(free)
                );
            }
            for k in 0..=size + 1 {
                proptest::prop_assert_eq!(tabulated.best_possible(k), searching.best_possible(k));
            }
        }
    }

    #[test]
    fn two_islands_are_tabulated_and_uniform_nodes_are_not() {
        assert!(TopologyIndex::build(&two_islands()).is_tabulated());
        assert!(!TopologyIndex::build(&LinkMatrix::uniform(8)).is_tabulated());
        assert!(!TopologyIndex::build_searching(&two_islands()).is_tabulated());
    }

    #[test]
    fn lowest_bits_takes_from_the_bottom() {
        assert_eq!(lowest_bits(0b1010_1010, 2), 0b0000_1010);
        assert_eq!(lowest_bits(0b1, 3), 0b1);
    }
}
