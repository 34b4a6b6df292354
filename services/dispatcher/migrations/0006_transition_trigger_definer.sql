-- The transition trigger writes the outbox and the run history as the dispatcher's
-- role, whoever changed the job: the control plane's role may settle a job
-- (UPDATE on jobs) without being able to write transitions of its own.
ALTER FUNCTION jobs_record_transition() SECURITY DEFINER SET search_path = public;
