-- Size suffixes only in strings: k M G T (powers of 1000) and Ki Mi Gi Ti (powers of 1024).
CREATE RESOURCE mem (MEMORY RESERVATION);
CREATE RESOURCE io (READ DISK d);
CREATE WORKLOAD all SETTINGS max_memory = '2Gi';
CREATE WORKLOAD a IN all SETTINGS max_memory = '10Mi', max_speed = '1k', max_burst = '2K';
CREATE WORKLOAD b IN all SETTINGS max_memory = '1G', max_bytes_inflight = '1Ti';
CREATE WORKLOAD c IN all SETTINGS max_memory = '1280Mi', max_io_requests = '100';
CREATE WORKLOAD d IN all SETTINGS max_memory = '1T', max_speed = '3M';
CREATE WORKLOAD e IN all SETTINGS max_memory = '213MB';
CREATE WORKLOAD e IN all SETTINGS max_memory = '1.5G';
CREATE WORKLOAD e IN all SETTINGS max_memory = '1P';
CREATE WORKLOAD e IN all SETTINGS max_memory = ' 5';
CREATE WORKLOAD e IN all SETTINGS max_memory = '';
CREATE WORKLOAD e IN all SETTINGS max_memory = '5 ';
CREATE WORKLOAD e IN all SETTINGS max_memory = '1gi';
CREATE WORKLOAD e IN all SETTINGS max_memory = '1Mi';
CREATE WORKLOAD f IN all SETTINGS max_memory = '99999999999999999999';
CREATE WORKLOAD g IN all SETTINGS max_speed = '2Gi', max_burst = '0';
