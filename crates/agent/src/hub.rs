//! Fan-out of one process's events to every client attached to it (the Start caller and any
//! number of `Connect`s). Each subscriber gets the events published after it subscribed.
//!
//! Buffering is bounded: each subscriber has a queue of [`SUBSCRIBER_QUEUE`] events and the
//! publisher waits for room in every live queue (envd's behaviour). A client that stops reading
//! therefore slows the process's output down to its pace; a client that disconnects is dropped
//! at the next event. With no subscriber at all, output is read and discarded (envd's
//! behaviour too), so a process never blocks on a full pipe nobody is watching.

use sandcell_proto::sync::lock;
use std::sync::{Arc, Mutex, MutexGuard};

use sandcell_proto::agent::{EndEvent, Event};
use tokio::sync::mpsc;

/// Events queued per subscriber (each at most [`crate::stream::CHUNK`] bytes of output).
pub const SUBSCRIBER_QUEUE: usize = 16;

#[derive(Debug, Default)]
struct Inner {
    subscribers: Vec<mpsc::Sender<Event>>,
    ended: Option<EndEvent>,
}

#[derive(Debug, Default)]
pub struct Hub {
    inner: Mutex<Inner>,
}

/// What a new subscriber gets: a live feed, or the end if the process is already over.
#[derive(Debug)]
pub enum Subscription {
    Live(mpsc::Receiver<Event>),
    Ended(EndEvent),
}

impl Hub {
    pub fn new() -> Arc<Self> {
        Arc::new(Hub::default())
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Pushes and takes only: a poisoned value is still consistent.
        lock(&self.inner)
    }

    pub fn subscribe(&self) -> Subscription {
        let mut inner = self.lock();
        if let Some(end) = &inner.ended {
            return Subscription::Ended(end.clone());
        }
        let (tx, rx) = mpsc::channel(SUBSCRIBER_QUEUE);
        inner.subscribers.push(tx);
        Subscription::Live(rx)
    }

    /// Whether anyone listens (publishers skip encoding output nobody will read).
    pub fn has_subscribers(&self) -> bool {
        let mut inner = self.lock();
        inner.subscribers.retain(|s| !s.is_closed());
        !inner.subscribers.is_empty()
    }

    /// Delivers `event` to every live subscriber, waiting for room in each queue.
    pub async fn publish(&self, event: Event) {
        let subscribers: Vec<_> = self.lock().subscribers.clone();
        let mut gone = false;
        for s in &subscribers {
            gone |= s.send(event.clone()).await.is_err();
        }
        if gone {
            self.lock().subscribers.retain(|s| !s.is_closed());
        }
    }

    /// Publishes the end and closes every feed; later subscribers get [`Subscription::Ended`].
    pub async fn finish(&self, end: EndEvent) {
        let subscribers = {
            let mut inner = self.lock();
            inner.ended = Some(end.clone());
            std::mem::take(&mut inner.subscribers)
        };
        for s in subscribers {
            // A subscriber that left does not need the end.
            let _ = s.send(Event::End(end.clone())).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandcell_proto::agent::DataEvent;

    fn data(s: &str) -> Event {
        Event::Data(DataEvent {
            stdout: Some(s.to_owned()),
            ..Default::default()
        })
    }

    #[tokio::test]
    async fn late_subscribers_get_later_events_and_the_end() {
        let hub = Hub::new();
        assert!(!hub.has_subscribers());
        hub.publish(data("nobody")).await;
        let Subscription::Live(mut a) = hub.subscribe() else {
            panic!("hub ended early")
        };
        hub.publish(data("one")).await;
        let Subscription::Live(mut b) = hub.subscribe() else {
            panic!("hub ended early")
        };
        hub.publish(data("two")).await;
        hub.finish(EndEvent::default()).await;
        let drain = |rx: &mut mpsc::Receiver<Event>| {
            let mut got = Vec::new();
            while let Ok(e) = rx.try_recv() {
                got.push(e);
            }
            got
        };
        assert_eq!(
            drain(&mut a),
            vec![data("one"), data("two"), Event::End(EndEvent::default())]
        );
        assert_eq!(
            drain(&mut b),
            vec![data("two"), Event::End(EndEvent::default())]
        );
        assert!(matches!(hub.subscribe(), Subscription::Ended(_)));
    }

    #[tokio::test]
    async fn a_departed_subscriber_does_not_block_publishing() {
        let hub = Hub::new();
        let Subscription::Live(rx) = hub.subscribe() else {
            panic!("hub ended early")
        };
        drop(rx);
        for i in 0..(SUBSCRIBER_QUEUE * 2) {
            hub.publish(data(&i.to_string())).await;
        }
        assert!(!hub.has_subscribers());
    }
}
