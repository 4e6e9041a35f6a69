-- RecordHits: when each of a batch of keys was last found by Get, kept only when later
-- than what is stored. The keys' parts and times come as arrays of one length.
UPDATE cached_outputs AS c SET last_hit_at = h.hit_at
FROM unnest(@projects::text[], @domains::text[], @task_names::text[], @cache_versions::text[],
            @signatures::text[], @inputs_hashes::text[], @hit_ats::timestamptz[])
     AS h(project, domain, task_name, cache_version, signature, inputs_hash, hit_at)
WHERE c.project = h.project AND c.domain = h.domain AND c.task_name = h.task_name
  AND c.cache_version = h.cache_version AND c.signature = h.signature AND c.inputs_hash = h.inputs_hash
  AND (c.last_hit_at IS NULL OR c.last_hit_at < h.hit_at)
