-- A model's own output limit (issue 45 item 9): the `max_tokens` the gateway sends an Anthropic
-- credential for a chat request that names none. NULL: the documented default.
ALTER TABLE models ADD COLUMN max_output_tokens BIGINT;
