// The PostgreSQL JDBC driver (pgjdbc, Debian's libpostgresql-jdbc-java) on connect, as a Java
// application or a GUI tool over JDBC (DBeaver, Metabase) does: the server's version, a
// prepared query and its result's metadata, and DatabaseMetaData's catalog reads (tables,
// columns, primary keys, schemas; the index, key and function reads GUI tools make). Prints
// one line per fact, so the output against PostgreSQL and against sluice can be compared.
//
//   java -cp /usr/share/java/postgresql.jar JdbcCatalog.java jdbc:postgresql://HOST:PORT/DB?user=U
import java.sql.*;
import java.util.*;

public class JdbcCatalog {
    public static void main(String[] args) throws Exception {
        try (Connection c = DriverManager.getConnection(args[0])) {
            DatabaseMetaData md = c.getMetaData();
            System.out.println("product: " + md.getDatabaseProductName() + " "
                    + md.getDatabaseMajorVersion());
            try (PreparedStatement ps = c.prepareStatement(
                    "SELECT id, name, score, amount FROM t WHERE id = ?")) {
                ps.setInt(1, 1);
                try (ResultSet rs = ps.executeQuery()) {
                    ResultSetMetaData m = rs.getMetaData();
                    List<String> cols = new ArrayList<>();
                    for (int i = 1; i <= m.getColumnCount(); i++) {
                        cols.add(m.getColumnName(i) + ":" + m.getColumnTypeName(i) + ":"
                                + m.getColumnType(i));
                    }
                    System.out.println("columns: " + cols);
                    while (rs.next()) {
                        System.out.println("row: " + rs.getInt(1) + " " + rs.getString(2) + " "
                                + rs.getDouble(3) + " " + rs.getBigDecimal(4));
                    }
                }
            }
            print("tables", md.getTables(null, "public", "%", new String[] {"TABLE", "VIEW"}),
                    "TABLE_SCHEM", "TABLE_NAME", "TABLE_TYPE");
            print("columns", md.getColumns(null, "public", "t", "%"), "COLUMN_NAME", "DATA_TYPE",
                    "TYPE_NAME", "COLUMN_SIZE", "DECIMAL_DIGITS", "NULLABLE", "ORDINAL_POSITION", "IS_NULLABLE",
                    "IS_AUTOINCREMENT");
            print("primary keys", md.getPrimaryKeys(null, "public", "t"), "COLUMN_NAME");
            print("schemas", md.getSchemas(null, "public"), "TABLE_SCHEM");
            // What GUI tools read next to draw a table (none of it exists here: no indexes,
            // keys or functions of the user's; each read must answer, with no rows).
            count("index info", md.getIndexInfo(null, "public", "t", false, true));
            count("imported keys", md.getImportedKeys(null, "public", "t"));
            count("exported keys", md.getExportedKeys(null, "public", "t"));
            count("functions", md.getFunctions(null, "public", "%"));
            count("procedures", md.getProcedures(null, "public", "%"));
            // The types a tool offers for a new column: sluice has fewer than PostgreSQL, so
            // only the common ones are compared.
            Set<String> types = new TreeSet<>();
            try (ResultSet rs = md.getTypeInfo()) {
                while (rs.next()) {
                    types.add(rs.getString("TYPE_NAME") + ":" + rs.getInt("DATA_TYPE"));
                }
            }
            types.retainAll(List.of("int4:4", "int8:-5", "text:12", "float8:8", "bool:-7",
                    "numeric:2", "timestamp:93", "date:91"));
            System.out.println("type info: " + types);
            try (Statement s = c.createStatement();
                    ResultSet rs = s.executeQuery("SELECT count(*) AS n FROM other")) {
                rs.next();
                System.out.println("count: " + rs.getLong("n"));
            }
        }
    }

    static void count(String what, ResultSet rs) throws SQLException {
        int n = 0;
        try (rs) {
            while (rs.next()) {
                n++;
            }
        }
        System.out.println(what + ": " + n + " rows");
    }

    static void print(String what, ResultSet rs, String... columns) throws SQLException {
        try (rs) {
            while (rs.next()) {
                StringBuilder line = new StringBuilder(what + ":");
                for (String col : columns) {
                    line.append(' ').append(rs.getString(col));
                }
                System.out.println(line);
            }
        }
    }
}
