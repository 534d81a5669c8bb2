//! A resource per device ordinal, made on first use from one configuration (`VRAMPOOL_CONF`,
//! then `configure`): what a C ABI such as PyTorch's pluggable allocator needs, whose entries
//! name a device and nothing else.
//!
//! Reading an existing entry is one atomic load. Entries are never freed while the registry
//! lives (`unhook_all` only unhooks them), so a reference to one stays valid as long as the
//! registry it came from.

use std::env::VarError;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, Ordering::Acquire, Ordering::Release};
use std::sync::{Mutex, MutexGuard};

use thiserror::Error;

use crate::config::{AllocatorConfig, ENV_VAR};
use crate::error::PoolError;

/// Device ordinals served: PyTorch's `DeviceIndex` is an `int8_t`.
pub const MAX_DEVICES: usize = 128;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum RegistryError {
    #[error("device {0} is not a device ordinal (0..{MAX_DEVICES})")]
    NotAnOrdinal(i64),
    /// The configuration is bad, or the device's resource could not be made.
    #[error("{0}")]
    Pool(#[from] PoolError),
    #[error("vrampool already serves allocations on device(s) {devices:?} with `{text}`; configure before the first allocation")]
    AlreadyServing { devices: Vec<i32>, text: String },
}

struct State {
    /// The configuration in force: None until first needed (then read from `VRAMPOOL_CONF`).
    config: Option<AllocatorConfig>,
    /// Every entry ever made, hooked or not, for `Drop`.
    made: Vec<*mut ()>,
}

/// A resource `E` per device, made on first use.
pub struct DeviceRegistry<E> {
    slots: [AtomicPtr<E>; MAX_DEVICES],
    state: Mutex<State>,
}

// SAFETY: the raw pointers are entries owned by the registry; `E` is shared between threads
// only by reference, which `E: Sync` allows, and sent (dropped) by `Drop`, which `E: Send` allows.
unsafe impl<E: Send + Sync> Send for DeviceRegistry<E> {}
// SAFETY: as above; every mutation goes through the atomics or the mutex.
unsafe impl<E: Send + Sync> Sync for DeviceRegistry<E> {}

impl<E: Send + Sync> Default for DeviceRegistry<E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E: Send + Sync> DeviceRegistry<E> {
    pub const fn new() -> Self {
        Self { slots: [const { AtomicPtr::new(null_mut()) }; MAX_DEVICES], state: Mutex::new(State { config: None, made: Vec::new() }) }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The entry of `ordinal`, if it has been made.
    #[inline]
    pub fn get(&self, ordinal: i32) -> Option<&E> {
        let p = self.slots.get(usize::try_from(ordinal).ok()?)?.load(Acquire);
        // SAFETY: a non-null slot points at an entry this registry made and frees only on drop.
        (!p.is_null()).then(|| unsafe { &*p })
    }

    /// The entry of `ordinal`, made by `make` from the configuration on first use.
    #[inline]
    pub fn get_or_make(&self, ordinal: i32, make: impl FnOnce(&AllocatorConfig, i32) -> Result<E, PoolError>) -> Result<&E, RegistryError> {
        match self.get(ordinal) {
            Some(entry) => Ok(entry),
            None => self.make(ordinal, make),
        }
    }

    #[cold]
    fn make(&self, ordinal: i32, make: impl FnOnce(&AllocatorConfig, i32) -> Result<E, PoolError>) -> Result<&E, RegistryError> {
        let index = usize::try_from(ordinal).ok().filter(|&i| i < MAX_DEVICES).ok_or(RegistryError::NotAnOrdinal(ordinal.into()))?;
        let mut state = self.lock();
        if let Some(entry) = self.get(ordinal) {
            return Ok(entry);
        }
        let entry = Box::into_raw(Box::new(make(config_in(&mut state)?, ordinal)?));
        state.made.push(entry.cast());
        self.slots[index].store(entry, Release);
        // SAFETY: just made; freed only on drop.
        Ok(unsafe { &*entry })
    }

    /// The entries made so far, by ordinal.
    pub fn entries(&self) -> Vec<(i32, &E)> {
        (0..MAX_DEVICES as i32).filter_map(|o| self.get(o).map(|e| (o, e))).collect()
    }

    /// Runs `f` over the entries with no entry being made meanwhile: what `f` sets before
    /// looking at them, an entry made later (under the same lock) sees.
    pub fn with_entries<T>(&self, f: impl FnOnce(&[(i32, &E)]) -> T) -> T {
        let _state = self.lock();
        f(&self.entries())
    }

    /// The configuration in force (reading `VRAMPOOL_CONF` if nothing set it yet).
    pub fn config(&self) -> Result<AllocatorConfig, RegistryError> {
        Ok(config_in(&mut self.lock())?.clone())
    }

    /// Sets the configuration, over `VRAMPOOL_CONF`, for entries made from now on; refused once
    /// one exists, unless it would make the same pools. Returns the text in force.
    pub fn configure(&self, text: &str) -> Result<String, RegistryError> {
        let mut state = self.lock();
        let config = AllocatorConfig::parse(&env_text()?, text)?;
        let devices: Vec<i32> = self.entries().into_iter().map(|(o, _)| o).collect();
        if !devices.is_empty() {
            let current = config_in(&mut state)?;
            if current.makes_the_same_pools(&config) {
                return Ok(current.text.clone());
            }
            return Err(RegistryError::AlreadyServing { devices, text: current.text.clone() });
        }
        let text = config.text.clone();
        state.config = Some(config);
        Ok(text)
    }

    /// Unhooks every entry (they stay valid, and are returned for the caller to close) and
    /// forgets the configuration: the next call starts afresh. For tests.
    pub fn unhook_all(&self) -> Vec<&E> {
        let mut state = self.lock();
        state.config = None;
        let p = self.slots.iter().map(|s| s.swap(null_mut(), Release)).filter(|p| !p.is_null());
        // SAFETY: entries are freed only on drop, which cannot run while `self` is borrowed.
        p.map(|p| unsafe { &*p }).collect()
    }
}

impl<E> Drop for DeviceRegistry<E> {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner());
        for p in state.made.drain(..) {
            // SAFETY: made by `Box::into_raw` in `make`, once each; no reference outlives `self`.
            drop(unsafe { Box::from_raw(p.cast::<E>()) });
        }
    }
}

/// `VRAMPOOL_CONF`'s text, empty when it is unset; one that is not UTF-8 is an error, not unset.
fn env_text() -> Result<String, PoolError> {
    match std::env::var(ENV_VAR) {
        Ok(text) => Ok(text),
        Err(VarError::NotPresent) => Ok(String::new()),
        Err(VarError::NotUnicode(raw)) => Err(PoolError::InvalidConfig(format!("{ENV_VAR} is not UTF-8 text: {raw:?}"))),
    }
}

fn config_in(state: &mut State) -> Result<&AllocatorConfig, PoolError> {
    if state.config.is_none() {
        state.config = Some(AllocatorConfig::parse(&env_text()?, "")?);
    }
    Ok(state.config.as_ref().expect("set just above"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DeviceKind;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    use std::sync::Arc;

    /// An entry that counts its drops.
    #[derive(Debug)]
    struct Entry {
        ordinal: i32,
        sim_capacity: u64,
        drops: Arc<AtomicUsize>,
    }

    impl Drop for Entry {
        fn drop(&mut self) {
            self.drops.fetch_add(1, Relaxed);
        }
    }

    fn maker(drops: &Arc<AtomicUsize>) -> impl Fn(&AllocatorConfig, i32) -> Result<Entry, PoolError> + '_ {
        move |config, ordinal| Ok(Entry { ordinal, sim_capacity: config.sim_capacity, drops: Arc::clone(drops) })
    }

    #[test]
    fn an_entry_is_made_once_per_ordinal_from_the_configuration() {
        let drops = Arc::new(AtomicUsize::new(0));
        let registry = DeviceRegistry::<Entry>::new();
        assert_eq!(registry.configure("device:sim,sim_capacity:1GB").unwrap(), "device:sim,sim_capacity:1GB");
        let a = registry.get_or_make(3, maker(&drops)).unwrap();
        assert_eq!((a.ordinal, a.sim_capacity), (3, 1 << 30));
        assert!(std::ptr::eq(a, registry.get_or_make(3, |_, _| panic!("made twice")).unwrap()));
        assert!(registry.get(0).is_none());
        assert_eq!(registry.entries().iter().map(|(o, _)| *o).collect::<Vec<_>>(), vec![3]);
        for bad in [-1, 128, i32::MAX] {
            assert_eq!(registry.get_or_make(bad, maker(&drops)).err(), Some(RegistryError::NotAnOrdinal(bad.into())));
            assert!(registry.get(bad).is_none());
        }
        let failed = registry.get_or_make(5, |_, _| Err(PoolError::InvalidConfig("no such device".into())));
        assert!(failed.unwrap_err().to_string().contains("no such device"));
        assert!(registry.get(5).is_none(), "a failed make leaves the slot empty");
        drop(registry);
        assert_eq!(drops.load(Relaxed), 1, "the registry frees its entries");
    }

    #[test]
    fn configuration_is_refused_once_a_pool_exists_unless_unchanged() {
        let drops = Arc::new(AtomicUsize::new(0));
        let registry = DeviceRegistry::<Entry>::new();
        registry.configure("device:sim,strategy:best_fit").unwrap();
        registry.configure("device:sim,strategy:slab").unwrap();
        assert_eq!(registry.config().unwrap().device, DeviceKind::Sim);
        registry.get_or_make(0, maker(&drops)).unwrap();
        assert_eq!(
            registry.configure("strategy:slab,device:sim").unwrap(),
            "device:sim,strategy:slab",
            "the same pools: the text in force"
        );
        let err = registry.configure("device:sim,strategy:buddy").unwrap_err();
        assert!(err.to_string().contains("already serves allocations on device(s) [0] with `device:sim,strategy:slab`"), "{err}");
        assert!(registry.configure("strategy:quantum").unwrap_err().to_string().contains("unknown strategy"));
        let unhooked = registry.unhook_all();
        assert_eq!(unhooked.len(), 1);
        assert_eq!(unhooked[0].ordinal, 0, "an unhooked entry stays valid");
        assert!(registry.get(0).is_none());
        registry.configure("device:sim,strategy:buddy").unwrap();
        drop(registry);
        assert_eq!(drops.load(Relaxed), 1, "unhooked entries are freed with the registry");
    }

    #[test]
    fn threads_racing_for_a_new_device_get_one_entry() {
        let drops = Arc::new(AtomicUsize::new(0));
        let registry = DeviceRegistry::<Entry>::new();
        let made = AtomicUsize::new(0);
        let addresses: Vec<usize> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        let e = registry
                            .get_or_make(7, |config, ordinal| {
                                made.fetch_add(1, Relaxed);
                                maker(&drops)(config, ordinal)
                            })
                            .unwrap();
                        e as *const Entry as usize
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(made.load(Relaxed), 1);
        assert!(addresses.windows(2).all(|w| w[0] == w[1]));
    }

    #[test]
    fn what_with_entries_sets_is_seen_by_entries_made_later() {
        let drops = Arc::new(AtomicUsize::new(0));
        let registry = DeviceRegistry::<Entry>::new();
        let mode = AtomicUsize::new(0);
        registry.get_or_make(0, maker(&drops)).unwrap();
        let seen = registry.with_entries(|entries| {
            mode.store(1, Relaxed);
            entries.len()
        });
        assert_eq!(seen, 1);
        registry
            .get_or_make(1, |c, o| {
                assert_eq!(mode.load(Relaxed), 1);
                maker(&drops)(c, o)
            })
            .unwrap();
    }
}
