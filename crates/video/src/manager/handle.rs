//! [`StreamManagerHandle`]: what everyone but the owner task holds. Every call is a
//! command with a reply channel to the owner (the stream set's one owner), except the URL
//! policy's judgement, made here so a slow DNS answer never holds up the owner.

use super::*;

/// A cloneable handle to the stream manager.
#[derive(Clone, Debug)]
pub struct StreamManagerHandle {
    pub(super) commands: mpsc::Sender<Command>,
    // Fixed at the start: the configured streams do not change while the server runs.
    pub(super) placement: Arc<ShardPlacement>,
    pub(super) policy: Arc<UrlPolicy>,
}

impl StreamManagerHandle {
    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> Result<T, ManagerError> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(make(tx))
            .await
            .map_err(|_| ManagerError::ShutDown)?;
        rx.await.map_err(|_| ManagerError::ShutDown)
    }

    /// Adds and starts a stream; its source is chosen from its URL, which the stream
    /// policy must allow.
    pub async fn add(&self, config: StreamConfig) -> Result<(), ManagerError> {
        admit(&self.policy, &config).await?;
        self.add_admitted(config).await
    }

    /// Adds a stream whose definition `admit` has already passed.
    pub(super) async fn add_admitted(&self, config: StreamConfig) -> Result<(), ManagerError> {
        self.ask(|reply| Command::Add {
            config: Box::new(config),
            opener: None,
            reply,
        })
        .await?
    }

    /// Adds a stream with a source of the caller's making (other kinds of camera, tests);
    /// its URL is only a label, so the stream policy does not judge it.
    pub async fn add_with_opener(
        &self,
        config: StreamConfig,
        opener: Arc<dyn Opener>,
    ) -> Result<(), ManagerError> {
        self.ask(|reply| Command::Add {
            config: Box::new(config),
            opener: Some(opener),
            reply,
        })
        .await?
    }

    /// Stops a stream and frees everything it held; answers when it has all ended.
    pub async fn remove(&self, name: &str) -> Result<(), ManagerError> {
        let name = name.to_string();
        self.ask(|reply| Command::Remove { name, reply }).await?
    }

    /// This server's shard, and the configured streams it left to other shards.
    pub fn placement(&self) -> &ShardPlacement {
        &self.placement
    }

    pub async fn list(&self) -> Result<Vec<StreamSummary>, ManagerError> {
        self.ask(Command::List).await
    }

    pub async fn status(&self, name: &str) -> Result<StreamReport, ManagerError> {
        let name = name.to_string();
        self.ask(|reply| Command::Status { name, reply }).await?
    }

    /// Live events of one stream.
    pub async fn subscribe(&self, name: &str) -> Result<EventSubscription, ManagerError> {
        let name = Some(name.to_string());
        self.ask(|reply| Command::Subscribe { name, reply }).await?
    }

    /// Live events of every stream, present and future.
    pub async fn subscribe_all(&self) -> Result<EventSubscription, ManagerError> {
        self.ask(|reply| Command::Subscribe { name: None, reply }).await?
    }

    /// Live object events of every stream (tracks starting and ending, zones, lines).
    pub async fn subscribe_objects(&self) -> Result<ObjectSubscription, ManagerError> {
        self.ask(Command::SubscribeObjects).await
    }

    async fn ask_analytics<T>(
        &self,
        name: &str,
        make: impl FnOnce(oneshot::Sender<T>) -> StageMessage,
    ) -> Result<T, ManagerError> {
        let n = name.to_string();
        let stage = self.ask(|reply| Command::Analytics { name: n, reply }).await??;
        let (tx, rx) = oneshot::channel();
        // The thread only goes away with its stream.
        let gone = || ManagerError::NotFound(name.to_string());
        stage.send(make(tx)).await.map_err(|_| gone())?;
        rx.await.map_err(|_| gone())
    }

    /// The stream's zones and lines now: who is inside, what crossed.
    pub async fn analytics(&self, name: &str) -> Result<AnalyticsReport, ManagerError> {
        self.ask_analytics(name, StageMessage::Report).await
    }

    /// Replaces the stream's zones, lines, or both (`None` keeps that set), checked against
    /// its frames; counts and occupancy of a replaced set start from zero.
    pub async fn set_places(
        &self,
        name: &str,
        zones: Option<Vec<ZoneConfig>>,
        lines: Option<Vec<LineConfig>>,
    ) -> Result<(), ManagerError> {
        let (z, l) = (zones.clone(), lines.clone());
        self.ask_analytics(name, |reply| StageMessage::SetPlaces {
            zones: z,
            lines: l,
            reply,
        })
        .await?
        .map_err(|problem| ManagerError::Places {
            name: name.to_string(),
            problem,
        })?;
        let name = name.to_string();
        self.commands
            .send(Command::Placed { name, zones, lines })
            .await
            .map_err(|_| ManagerError::ShutDown)
    }

    /// The stream's newest frame as a JPEG (boxes drawn when `annotate`), if it has one
    /// newer than `after_seq`.
    pub async fn latest_picture(
        &self,
        name: &str,
        annotate: bool,
        after_seq: Option<u64>,
    ) -> Result<Option<LatestPicture>, ManagerError> {
        self.ask_analytics(name, |reply| StageMessage::Latest {
            annotate,
            after_seq,
            reply,
        })
        .await
    }

    /// Stops every stream (waiting for each, as `remove` does) and ends the manager.
    pub async fn shutdown(&self) -> Result<(), ManagerError> {
        self.ask(Command::Shutdown).await
    }
}
