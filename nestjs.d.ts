/**
 * stampede-cache/nestjs: a NestJS module providing a `StampedeCache` for injection and closing it on
 * application shutdown. Needs `@nestjs/common` and `@nestjs/core` (peer dependencies).
 */
// Self-contained on purpose: no import from @nestjs/common, so these types work with Nest 10 and 11
// (CommonJS) and 12 (ESM only) alike, from CommonJS and ESM projects.
import { StampedeCache, StampedeCacheOptions } from './index'

export { StampedeCache }

/** Injection token of the cache: the same instance as the `StampedeCache` class token. */
export declare const STAMPEDE_CACHE: 'STAMPEDE_CACHE'
/** Injection token of the options the cache was built with. */
export declare const STAMPEDE_CACHE_OPTIONS: 'STAMPEDE_CACHE_OPTIONS'

interface ModuleScope {
  /** Register the module globally: every module can inject the cache without importing it. Default false. */
  isGlobal?: boolean | undefined
  /** The same as `isGlobal`. */
  global?: boolean | undefined
}

/** The constructor's options, plus where the module is visible. */
export interface StampedeCacheModuleOptions extends StampedeCacheOptions, ModuleScope {}

/** An injection token: a class, a string or a symbol. */
export type InjectionToken = string | symbol | Function

/** What a Nest module's `imports` holds: a module class, a dynamic module (or its promise), a forwardRef. */
export type ModuleImport = (new (...args: any[]) => any) | { module: new (...args: any[]) => any } | Promise<{ module: new (...args: any[]) => any }> | { forwardRef: () => any }

/** The dynamic module `forRoot`/`forRootAsync` return: a Nest `DynamicModule`. */
export interface StampedeCacheDynamicModule {
  module: typeof StampedeCacheModule
  global: boolean
  imports?: any[]
  providers: any[]
  exports: any[]
}

export interface StampedeCacheModuleAsyncOptions extends ModuleScope {
  /** Modules that export the providers named in `inject`. */
  imports?: ModuleImport[] | undefined
  /** Makes the constructor's options (may be async) from the providers named in `inject`. */
  useFactory: (...args: any[]) => StampedeCacheOptions | undefined | Promise<StampedeCacheOptions | undefined>
  /** Providers handed to `useFactory`, found in `imports` or a global module. */
  inject?: Array<InjectionToken | { token: InjectionToken; optional: boolean }> | undefined
}

export declare class StampedeCacheModule {
  /** A module providing a `StampedeCache` built from `options`, closed on application shutdown. */
  static forRoot(options?: StampedeCacheModuleOptions): StampedeCacheDynamicModule
  /** The same, with the options made by `useFactory` from injected providers. */
  static forRootAsync(options: StampedeCacheModuleAsyncOptions): StampedeCacheDynamicModule
}

/** Injects the module's cache: the same as `@Inject(StampedeCache)`. */
export declare function InjectStampedeCache(): PropertyDecorator & ParameterDecorator
