-- New jobs wake every dispatcher at once (each LISTENs on sluice_jobs) instead of
-- at its next timed round. One notice per inserting statement, sent on commit;
-- the round stays as the fallback (retries fall due, a listener reconnecting).
CREATE FUNCTION jobs_notify_new() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('sluice_jobs', '');
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_inserted AFTER INSERT ON jobs
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_notify_new();
