-- Names are back-quoted in create_query unless plain; all/distinct/table/select/null always are.
CREATE WORKLOAD all;
CREATE WORKLOAD `distinct` IN all;
CREATE WORKLOAD "table" IN all;
CREATE WORKLOAD `Select` IN all;
CREATE WORKLOAD `NULL` IN all;
CREATE WORKLOAD `with space` IN all;
CREATE WORKLOAD "dash-ed" IN all;
CREATE WORKLOAD 1st IN all;
CREATE WORKLOAD _under IN all;
CREATE WORKLOAD `üñí` IN all;
CREATE WORKLOAD plain_name IN `all`;
CREATE WORKLOAD child IN `with space`;
CREATE WORKLOAD dot IN "dash-ed";
CREATE RESOURCE `my res` (READ DISK `my disk`, WRITE DISK "other.disk");
CREATE WORKLOAD forq IN all SETTINGS max_io_requests = 3 FOR `my res`;
CREATE WORKLOAD `in` IN all;
CREATE WORKLOAD settings IN all;
