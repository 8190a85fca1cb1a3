/*
 * version.h - the one place the version lives (`sampan version`, the KServe
 * server metadata, the Server header and logs).
 */
#ifndef SAMPAN_VERSION_H
#define SAMPAN_VERSION_H

#define SAMPAN_VERSION "0.1.0"

#endif /* SAMPAN_VERSION_H */
