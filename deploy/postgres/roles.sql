-- Sluice's two database roles, least privilege. Run once as a superuser (or a role
-- with CREATEROLE and CREATEDB):
--   psql -v dispatcher_password=… -v api_password=… -f deploy/postgres/roles.sql
-- Then start one dispatcher (it migrates, as the owner), and apply
-- deploy/postgres/api-grants.sql in the database as sluice_dispatcher.
--
-- sluice_dispatcher owns the database, so its migrations create the tables it then
-- owns, and the job-transition trigger runs as it (SECURITY DEFINER); it is no
-- superuser and cannot create roles or databases.
CREATE ROLE sluice_dispatcher LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD :'dispatcher_password';
-- sluice_api reads runs, history and audit, and writes only what
-- api-grants.sql lists (audit, backfills, settles, notifications).
CREATE ROLE sluice_api LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD :'api_password';
CREATE DATABASE sluice OWNER sluice_dispatcher;
\connect sluice
-- PostgreSQL 15 gives the public schema to the database owner and takes CREATE
-- from everyone else; say so for older servers too.
ALTER SCHEMA public OWNER TO sluice_dispatcher;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO sluice_api;
