CREATE TABLE public.accounts (id integer NOT NULL, balance integer NOT NULL);
ALTER TABLE ONLY public.accounts ADD CONSTRAINT accounts_pkey PRIMARY KEY (id);
