-- The consensus schema before schema versions (sqlite), frozen: see tests/store/test_migrations.py.

CREATE TABLE upsert_shards (
	shard_id VARCHAR(128) NOT NULL,
	upper BIGINT NOT NULL,
	since BIGINT NOT NULL,
	seqno BIGINT NOT NULL,
	config TEXT NOT NULL,
	created_at FLOAT NOT NULL,
	PRIMARY KEY (shard_id)
);

CREATE TABLE upsert_bindings (
	shard_id VARCHAR(128) NOT NULL,
	ts BIGINT NOT NULL,
	ranges TEXT NOT NULL,
	minted_by VARCHAR(512) NOT NULL,
	minted_at FLOAT NOT NULL,
	PRIMARY KEY (shard_id, ts)
);

CREATE TABLE upsert_batches (
	shard_id VARCHAR(128) NOT NULL,
	ts BIGINT NOT NULL,
	writer_id VARCHAR(512) NOT NULL,
	token VARCHAR(64) NOT NULL,
	run TEXT NOT NULL,
	stats TEXT NOT NULL,
	committed_at FLOAT NOT NULL,
	PRIMARY KEY (shard_id, ts)
);

CREATE TABLE upsert_quarantined_files (
	shard_id VARCHAR(128) NOT NULL,
	file VARCHAR(2048) NOT NULL,
	reason TEXT NOT NULL,
	ts BIGINT NOT NULL,
	PRIMARY KEY (shard_id, file)
);

CREATE TABLE upsert_compactions (
	shard_id VARCHAR(128) NOT NULL,
	since BIGINT NOT NULL,
	run TEXT NOT NULL,
	compacted_at FLOAT NOT NULL,
	PRIMARY KEY (shard_id)
);

CREATE TABLE upsert_catalog_locks (
	shard_id VARCHAR(128) NOT NULL,
	version BIGINT NOT NULL,
	changed_at FLOAT NOT NULL,
	PRIMARY KEY (shard_id)
);

CREATE TABLE upsert_gc_claims (
	path VARCHAR(1024) NOT NULL,
	shard_id VARCHAR(128) NOT NULL,
	claimed_at FLOAT NOT NULL,
	PRIMARY KEY (path)
);

CREATE INDEX ix_upsert_gc_claims_shard_id ON upsert_gc_claims (shard_id);

CREATE TABLE upsert_replaced_runs (
	shard_id VARCHAR(128) NOT NULL,
	path VARCHAR(1024) NOT NULL,
	replaced_at FLOAT NOT NULL,
	PRIMARY KEY (shard_id, path)
);

CREATE TABLE upsert_blob_owners (
	shard_id VARCHAR(128) NOT NULL,
	generation VARCHAR(64) NOT NULL,
	taken_at FLOAT NOT NULL,
	PRIMARY KEY (shard_id)
);

CREATE TABLE upsert_source_settled (
	shard_id VARCHAR(128) NOT NULL,
	partition VARCHAR(512) NOT NULL,
	through_ts BIGINT NOT NULL,
	binding_digest VARCHAR(64) NOT NULL,
	names TEXT NOT NULL,
	PRIMARY KEY (shard_id, partition)
);

CREATE TABLE upsert_streams (
	shard_id VARCHAR(128) NOT NULL,
	status VARCHAR(16) NOT NULL,
	version BIGINT NOT NULL,
	epoch BIGINT NOT NULL,
	seeked_epoch BIGINT,
	seek_position TEXT,
	changed_by VARCHAR(512) NOT NULL,
	changed_at FLOAT NOT NULL,
	reason TEXT NOT NULL,
	PRIMARY KEY (shard_id)
);

CREATE TABLE upsert_stream_history (
	id INTEGER NOT NULL,
	shard_id VARCHAR(128) NOT NULL,
	version BIGINT NOT NULL,
	action VARCHAR(32) NOT NULL,
	from_status VARCHAR(16),
	to_status VARCHAR(16) NOT NULL,
	epoch BIGINT NOT NULL,
	actor VARCHAR(512) NOT NULL,
	at FLOAT NOT NULL,
	reason TEXT NOT NULL,
	PRIMARY KEY (id)
);

CREATE INDEX ix_upsert_stream_history_shard_id ON upsert_stream_history (shard_id);

CREATE TABLE upsert_frontier_observations (
	id INTEGER NOT NULL,
	shard_id VARCHAR(128) NOT NULL,
	observed_at FLOAT NOT NULL,
	observer VARCHAR(512) NOT NULL,
	payload TEXT NOT NULL,
	PRIMARY KEY (id)
);

CREATE INDEX ix_upsert_frontier_observations_shard_id ON upsert_frontier_observations (shard_id);

CREATE INDEX ix_upsert_frontier_observations_shard_time ON upsert_frontier_observations (shard_id, observed_at);

CREATE TABLE upsert_frontier_alerts (
	shard_id VARCHAR(128) NOT NULL,
	version BIGINT NOT NULL,
	state TEXT NOT NULL,
	PRIMARY KEY (shard_id)
);
