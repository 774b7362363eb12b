//! The concurrency slots one request holds: taken before its rate layers are
//! decided, renewed while it lasts, given back when it ends (the logging
//! phase) or, should the request be dropped without one, when they are
//! dropped.

use std::sync::Arc;
use std::time::Duration;

use log::debug;
use tokio::task::JoinHandle;

use super::verdict::{Outcome, OutcomeKind};
use floodgate_algorithm::Decision;
use floodgate_limiter::{Enforcement, LimiterError, Slot, Store};
use floodgate_policy::{SlotLayer, Upgrades};

/// What a client refused for want of a slot is told to wait.
const RETRY_US: u64 = 1_000_000;

pub(super) struct HeldSlots {
    store: Arc<dyn Store>,
    held: Vec<(Slot, Upgrades)>,
    renewal: Option<JoinHandle<()>>,
}

impl HeldSlots {
    /// Takes every enforcing layer's slot, or none: when one is refused, the
    /// ones already taken are given back. A shadow layer's slot is held when
    /// granted and only counted when not. The outcomes are in layer order.
    pub(super) async fn acquire(
        store: Arc<dyn Store>,
        layers: Vec<SlotLayer>,
    ) -> Result<(HeldSlots, Vec<Outcome>), LimiterError> {
        let mut slots = HeldSlots {
            store,
            held: Vec::with_capacity(layers.len()),
            renewal: None,
        };
        let mut outcomes = Vec::with_capacity(layers.len());
        for layer in layers {
            let decision = match slots.store.acquire(&layer.slot).await? {
                // The earliest lease's end is no estimate of when a slot
                // frees (leases are renewed while requests last): a client
                // is told to try again shortly.
                refused if !refused.allowed() => {
                    Decision::refused(layer.slot.max(), 0, RETRY_US, RETRY_US)
                }
                admitted => admitted,
            };
            outcomes.push(Outcome {
                limit: layer.limit,
                name: layer.slot.name().clone(),
                quota: layer.slot.max(),
                window_us: layer.slot.lease_us(),
                enforcement: layer.enforcement,
                kind: OutcomeKind::Slot,
                identity: layer.slot.key().identity,
                decision,
            });
            if decision.allowed() {
                slots.held.push((layer.slot, layer.upgrades));
            } else if layer.enforcement == Enforcement::Enforce {
                slots.release().await;
                break;
            }
        }
        slots.renew_while_held();
        Ok((slots, outcomes))
    }

    /// Renews every lease a third of the way through it, so that a slot
    /// outlives its lease only while its request does.
    fn renew_while_held(&mut self) {
        let Some(shortest) = self.held.iter().map(|(slot, _)| slot.lease_us()).min() else {
            return;
        };
        let every = Duration::from_micros((shortest / 3).max(1));
        let store = self.store.clone();
        let slots: Vec<Slot> = self.held.iter().map(|(slot, _)| slot.clone()).collect();
        self.renewal = Some(tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                for slot in &slots {
                    match store.renew(slot).await {
                        Ok(true) => {}
                        // Expired (the store was away longer than a lease):
                        // the request goes on; its slot may be another's.
                        Ok(false) => debug!("concurrency lease of {} lost", slot.name()),
                        Err(e) => debug!("concurrency lease of {} not renewed: {e}", slot.name()),
                    }
                }
            }
        }));
    }

    /// The answer is an upgrade (101): gives back the slots of layers that
    /// do not count upgraded connections.
    pub(super) fn upgraded(&mut self) {
        if self
            .held
            .iter()
            .all(|(_, upgrades)| *upgrades == Upgrades::Include)
        {
            return;
        }
        let (excluded, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|(_, upgrades)| *upgrades == Upgrades::Exclude);
        self.held = kept;
        spawn_release(self.store.clone(), excluded);
        // Renewed from now on: the slots kept, and only those.
        if let Some(renewal) = self.renewal.take() {
            renewal.abort();
        }
        self.renew_while_held();
    }

    /// Gives every slot back.
    pub(super) async fn release(&mut self) {
        if let Some(renewal) = self.renewal.take() {
            renewal.abort();
        }
        for (slot, _) in std::mem::take(&mut self.held) {
            if let Err(e) = self.store.release(&slot).await {
                debug!("concurrency slot of {} not released: {e}", slot.name());
            }
        }
    }
}

impl Drop for HeldSlots {
    /// A request dropped without its logging phase (a drain cut short)
    /// still gives its slots back.
    fn drop(&mut self) {
        if let Some(renewal) = self.renewal.take() {
            renewal.abort();
        }
        if !self.held.is_empty() {
            spawn_release(self.store.clone(), std::mem::take(&mut self.held));
        }
    }
}

fn spawn_release(store: Arc<dyn Store>, slots: Vec<(Slot, Upgrades)>) {
    if slots.is_empty() {
        return;
    }
    // Without a runtime (the process is ending) the leases expire instead.
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            for (slot, _) in slots {
                let _ = store.release(&slot).await;
            }
        });
    }
}
